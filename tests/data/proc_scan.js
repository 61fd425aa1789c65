// Run inside an agentctl container (`kubectl exec … -- node -e "$(cat proc_scan.js)"`), as the
// container's user, the agent's: reads /proc/<pid>/environ and every readable mapping of
// /proc/<pid>/mem of each process it can see (itself excepted), and reports where each needle
// was found. The needles come on stdin as a JSON object {name: text}, so that no command line
// holds them. Prints one JSON array: {pid, cmdline, environ, memory, memoryRead, found[]}, where
// environ and memory are "read" or the error code that refused them.
const fs = require("fs");

const needles = Object.entries(JSON.parse(fs.readFileSync(0, "utf8"))).map(([name, text]) => [
  name,
  Buffer.from(text),
]);
const CHUNK = 4 << 20;
const OVERLAP = Math.max(...needles.map(([, n]) => n.length));

function scanMemory(pid, entry) {
  const maps = fs.readFileSync(`/proc/${pid}/maps`, "utf8");
  const fd = fs.openSync(`/proc/${pid}/mem`, "r");
  const buf = Buffer.alloc(CHUNK + OVERLAP);
  try {
    for (const line of maps.split("\n")) {
      const [range, perms] = line.split(/\s+/);
      if (!range || !perms || !perms.startsWith("r") || /\[(vvar|vsyscall)\]$/.test(line)) {
        continue;
      }
      const [start, end] = range.split("-").map((h) => parseInt(h, 16));
      for (let at = start; at < end; at += CHUNK) {
        const len = Math.min(end - at, CHUNK + OVERLAP);
        let n;
        try {
          n = fs.readSync(fd, buf, 0, len, at);
        } catch {
          continue; // a chunk that cannot be read (a guard page); the rest of the mapping may
        }
        entry.memoryRead += n;
        const chunk = buf.subarray(0, n);
        for (const [name, needle] of needles) {
          if (chunk.includes(needle) && !entry.found.includes(`${name} in memory`)) {
            entry.found.push(`${name} in memory`);
          }
        }
      }
    }
  } finally {
    fs.closeSync(fd);
  }
}

const report = [];
for (const name of fs.readdirSync("/proc")) {
  if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
  const pid = Number(name);
  const entry = { pid, cmdline: "", environ: "read", memory: "read", memoryRead: 0, found: [] };
  try {
    entry.cmdline = fs.readFileSync(`/proc/${pid}/cmdline`).toString().replace(/\0/g, " ").trim();
  } catch {
    continue; // gone meanwhile
  }
  try {
    const environ = fs.readFileSync(`/proc/${pid}/environ`);
    for (const [needle, text] of needles) {
      if (environ.includes(text)) entry.found.push(`${needle} in environ`);
    }
  } catch (error) {
    entry.environ = error.code || String(error);
  }
  try {
    scanMemory(pid, entry);
  } catch (error) {
    entry.memory = error.code || String(error);
  }
  if (!fs.existsSync(`/proc/${pid}`)) continue; // ended during the scan (a probe's exec)
  report.push(entry);
}
process.stdout.write(JSON.stringify(report));
