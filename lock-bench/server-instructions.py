"""Per-cycle instruction counts from `callgrind_annotate --inclusive=yes`
on standard input; used by server-instructions.sh (argument: cycles counted)."""
import re
import sys

cycles = int(sys.argv[1])
counts = {}
for line in sys.stdin:
    m = re.match(r"\s*([\d,]+) \([\s\d.]+%\)\s+\S*?:(\S+) \[", line)
    if m:
        counts.setdefault(m.group(2), int(m.group(1).replace(",", "")))
total = counts.get("main", 0)
commands = counts.get("readQueryFromClient", 0)
print(f"  command processing (readQueryFromClient): {commands / cycles:8.0f} instructions a cycle")
print(f"  whole server:                             {total / cycles:8.0f}")
named = [(c, n) for n, c in counts.items() if not n.startswith("0x") and c < commands]
for count, name in sorted(named, reverse=True)[:25]:
    print(f"    {count / cycles:8.0f}  {name}")
