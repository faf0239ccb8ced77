"""A driver script run under a real pseudo-terminal, and a minimal terminal that replays its
output (cursor moves, line erases) into the lines a person would see, scrollback included."""

from __future__ import annotations

import os
import pty
import re
import sys

# CSI sequences (cursor moves, erases, colours), OSC strings, charset and keypad modes.
_SEQUENCE = re.compile(r"\x1b\[([0-9;?]*)([A-Za-z])|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)"
                       r"|\x1b[()][A-Za-z0-9]|\x1b[=>78]")


def run_in_terminal(script: str, env: dict[str, str]) -> tuple[int, str]:
    """Run ``python script`` with stdin, stdout and stderr on a new pty; return its exit
    status and everything it wrote."""
    pid, fd = pty.fork()
    if pid == 0:  # the child
        try:
            os.execve(sys.executable, [sys.executable, script], env)
        finally:
            os._exit(127)
    chunks: list[bytes] = []
    while True:
        try:
            data = os.read(fd, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not data:
            break
        chunks.append(data)
    _, status = os.waitpid(pid, 0)
    os.close(fd)
    return os.waitstatus_to_exitcode(status), b"".join(chunks).decode(errors="replace")


def replay(output: str) -> list[str]:
    """The lines on screen and in the scrollback once ``output`` has been drawn."""
    rows: list[list[str]] = [[]]
    row = col = 0
    at = 0
    while at < len(output):
        match = _SEQUENCE.match(output, at)
        if match:
            at = match.end()
            params, command = match.group(1), match.group(2)
            if command is None or (params or "").startswith("?"):
                continue
            numbers = [int(p) for p in (params or "").split(";") if p.isdigit()]
            n = numbers[0] if numbers else None
            if command == "A":
                row = max(0, row - (n or 1))
            elif command == "B":
                row += n or 1
            elif command == "C":
                col += n or 1
            elif command == "D":
                col = max(0, col - (n or 1))
            elif command == "G":
                col = max(0, (n or 1) - 1)
            elif command == "K":
                while len(rows) <= row:
                    rows.append([])
                line = rows[row]
                if not n:
                    del line[col:]
                elif n == 1:
                    line[:col] = [" "] * min(col, len(line))
                else:
                    line.clear()
            continue
        char = output[at]
        at += 1
        if char == "\r":
            col = 0
        elif char == "\n":
            row += 1
        elif char in "\x07\x08":
            col = max(0, col - 1) if char == "\x08" else col
        else:
            while len(rows) <= row:
                rows.append([])
            line = rows[row]
            if len(line) < col:
                line.extend(" " * (col - len(line)))
            if col < len(line):
                line[col] = char
            else:
                line.append(char)
            col += 1
    return ["".join(line).rstrip() for line in rows]
