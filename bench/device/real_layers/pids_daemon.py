"""What vCUDA's node daemon does for a container: keeps /etc/vcuda/pids.config (the container's pids, sorted
binary ints, which vCUDA bsearches to sum its processes' memory from NVML) current. Here the container is the
process tree under one pid. usage: pids_daemon.py PIDS_FILE ROOT_PID   (until ROOT_PID exits)"""

from __future__ import annotations

import os
import struct
import sys
import time


def descendants(root: int) -> list[int]:
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as file:
                    parents[int(entry)] = int(file.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    tree, changed = {root}, True
    while changed:
        grown = {pid for pid, parent in parents.items() if parent in tree}
        changed = not grown <= tree
        tree |= grown
    return sorted(tree)


def main() -> None:
    path, root = sys.argv[1], int(sys.argv[2])
    while os.path.exists(f"/proc/{root}"):
        data = b"".join(struct.pack("i", pid) for pid in descendants(root))
        with open(path + ".tmp", "wb") as file:
            file.write(data)
        os.replace(path + ".tmp", path)
        time.sleep(0.5)


if __name__ == "__main__":
    main()
