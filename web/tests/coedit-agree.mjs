// Reads cases written by tests/browser.rs (operations over texts, with what
// the server's `tandem::coedit` made of them) and prints what
// `web/coedit.js` makes of the same: the Rust test compares.
//
//   node web/tests/coedit-agree.mjs cases.json

import fs from 'node:fs';
import { apply, compose, transform, transformIndex, diff } from '../coedit.js';

const cases = JSON.parse(fs.readFileSync(process.argv[2], 'utf8'));
const out = cases.map((c) => {
  const [a2, b2] = transform(c.a, c.b);
  const afterA = apply(c.a, c.text);
  return {
    applied: afterA,
    transformed: [a2, b2],
    converged: apply(b2, afterA) === apply(a2, apply(c.b, c.text)),
    composed: compose(c.a, c.c),
    carets: c.carets.map((i) => [transformIndex(c.a, i, false), transformIndex(c.a, i, true)]),
    diffed: apply(diff(c.text, c.other), c.text) === c.other,
  };
});
process.stdout.write(JSON.stringify(out));
