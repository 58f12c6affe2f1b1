//! Process limits and memory readings from `/proc`.

/// Raise the soft `RLIMIT_NOFILE` to the hard limit, so this process (and any
/// server it spawns, which inherits the limit) can hold many sockets.
/// Returns the soft limit in force afterwards.
pub fn raise_nofile_limit() -> u64 {
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    unsafe {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 0;
        }
        if lim.rlim_cur < lim.rlim_max {
            let want = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                return want.rlim_cur;
            }
        }
        lim.rlim_cur
    }
}

/// Resident set size of a process in bytes (`VmRSS` of `/proc/<pid>/status`).
pub fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_vm_rss(&status)
}

/// Anonymous resident memory of a process in bytes (`RssAnon`): its heap
/// and stacks, without the pages of its program file (`RssFile`), which
/// the kernel maps in as code runs and may drop at any time.
pub fn rss_anon_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&status, "RssAnon:")
}

/// Resident set size of this process in bytes.
pub fn self_rss_bytes() -> Option<u64> {
    rss_bytes(std::process::id())
}

/// Peak resident set size of a process in bytes (`VmHWM` of
/// `/proc/<pid>/status`): what a phase needed at its busiest, read after it.
pub fn peak_rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    parse_status_kb(&status, "VmHWM:")
}

/// `VmRSS:   1234 kB` → bytes.
pub fn parse_vm_rss(status: &str) -> Option<u64> {
    parse_status_kb(status, "VmRSS:")
}

/// `<field>   1234 kB` of `/proc/<pid>/status` → bytes.
fn parse_status_kb(status: &str, field: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Total CPU time (user + system) a process has used, in seconds, from
/// `/proc/<pid>/stat`.
pub fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the `(comm)`, which may contain spaces.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // utime and stime are fields 14 and 15 (1-based) of the whole line,
    // i.e. 11 and 12 (0-based) after the state field.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / hz.max(1.0))
}

/// Busy CPU time of the whole machine so far, in seconds (`/proc/stat`:
/// everything but idle and iowait). Differences over a window tell how much
/// CPU other processes took while we measured.
pub fn machine_busy_seconds() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal …
    let busy: f64 = v
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 3 && *i != 4)
        .map(|(_, x)| x)
        .sum();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some(busy / hz.max(1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_vm_rss_in_bytes() {
        let s = "Name:\ttandem\nVmPeak:\t  9 kB\nVmRSS:\t   2048 kB\nThreads: 4\n";
        assert_eq!(parse_vm_rss(s), Some(2048 * 1024));
        assert!(self_rss_bytes().unwrap_or(0) > 0);
        assert!(cpu_seconds(std::process::id()).is_some());
        assert!(machine_busy_seconds().is_some());
    }
}
