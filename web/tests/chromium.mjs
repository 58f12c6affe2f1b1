// Headless Chromium for the page tests, with the flags this machine's
// closed network needs (no background networking, no component updates).
import { chromium } from 'playwright-core';

export function launch(extraArgs = []) {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    // playwright gives every launch a fresh, empty --user-data-dir.
    args: [
      '--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      ...extraArgs,
    ],
  });
}
