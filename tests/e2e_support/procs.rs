//! What the processes of a pod played by the harness hold: found by the pod UID the harness puts
//! into the environment of each process it starts or execs into the pod (`KANDEV_POD_UID`), and
//! read through `/proc/<pid>/environ` and `/proc/<pid>/mem` (every readable mapping).

use std::io::{Read, Seek, SeekFrom};

/// One process of the pod and where a needle was found in it.
#[derive(Debug)]
pub struct Held {
    pub pid: u32,
    pub cmdline: String,
    pub in_environ: bool,
    pub in_memory: bool,
    /// How many bytes of its memory could be read.
    pub memory_read: usize,
}

/// The live processes whose environment names the pod `uid`.
pub fn pod_processes(uid: &str) -> Vec<u32> {
    let marker = format!("KANDEV_POD_UID={uid}");
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|v| v == marker.as_bytes()))
        })
        .collect()
}

/// Whether process `pid` holds `needle` in its environment or anywhere in its memory.
pub fn holds(pid: u32, needle: &[u8]) -> Held {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
    let (in_memory, memory_read) = memory_holds(pid, needle);
    Held {
        pid,
        cmdline: String::from_utf8_lossy(&cmdline).replace('\0', " "),
        in_environ: contains(&environ, needle),
        in_memory,
        memory_read,
    }
}

fn memory_holds(pid: u32, needle: &[u8]) -> (bool, usize) {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    let Ok(mut mem) = std::fs::File::open(format!("/proc/{pid}/mem")) else {
        return (false, 0);
    };
    let mut read = 0;
    for line in maps.lines() {
        let mut fields = line.split_whitespace();
        let (Some(range), Some(perms)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !perms.starts_with('r') || line.ends_with("[vvar]") || line.ends_with("[vsyscall]") {
            continue;
        }
        let Some((start, end)) = range.split_once('-') else {
            continue;
        };
        let (Ok(start), Ok(end)) = (u64::from_str_radix(start, 16), u64::from_str_radix(end, 16))
        else {
            continue;
        };
        // In chunks that overlap by the needle's length, so a needle across a chunk's end counts;
        // a chunk that cannot be read (a guard page) is skipped, not the rest of the mapping.
        const CHUNK: u64 = 4 << 20;
        let mut at = start;
        while at < end {
            let len = (end - at).min(CHUNK + needle.len() as u64);
            let mut buf = vec![0; len as usize];
            let got = match mem.seek(SeekFrom::Start(at)) {
                Ok(_) => mem.read(&mut buf).unwrap_or(0),
                Err(_) => 0,
            };
            read += got;
            if contains(&buf[..got], needle) {
                return (true, read);
            }
            at += CHUNK;
        }
    }
    (false, read)
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && haystack.windows(needle.len()).any(|w| w == needle)
}
