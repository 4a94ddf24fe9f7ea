#!/usr/bin/env python3
"""Every output flag of the libra CLI against the paths that are not plain
files, and against each other (issue 35, F1 and F2).

    python3 output_paths.py LIBRA      # run from anywhere; uses tests/cli's data

For each flag in OUTPUTS, in a scratch directory:
  * a symbolic link to a 0600 file: exit 0, the link is still a link, its
    target holds the output and is still 0600;
  * a FIFO with a reader: exit 0, the reader gets the output, the FIFO stays;
    with no reader: exit 2, one line, the FIFO stays;
  * a character device (root only: a null-device node made here): exit 0,
    still a character device;
  * a socket: exit 2, one line, before any work, the socket stays;
and every pair of output flags of one command naming one file (or a file
inside simulate's --report directory): exit 2, one line, nothing written.
"""
import os
import socket
import stat
import subprocess
import sys
import tempfile
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
GQA = ["plan", "data/plan/gqa.jsonl", "--seq-len", "4", "--cp", "2", "--block", "2", "--head-shards", "2",
       "--heads-q", "4", "--heads-kv", "1", "--head-dim", "2"]
SIM = ["simulate", "--config", "data/simulate/tiny.json"]
ELASTIC = ["simulate", "builtin:paper-256k", "--elastic", "--seq-len", "8192", "--gbs", "8", "--dp", "4", "--cp", "2",
           "--heads-q", "4", "--heads-kv", "2", "--head-dim", "16", "--chunks", "2", "--pool-size", "2",
           "--head-shards", "2", "--block-size", "1024", "--windows", "1"]
EXEC = ["exec", "../mpi/data/pool_p2_l512.jsonl", "--seq-len", "512", "--cp", "2", "--block-size", "64",
        "--head-shards", "2", "--heads-q", "4", "--heads-kv", "2", "--head-dim", "16", "--ranks", "4"]
KERNEL = ["bench", "kernel", "--lengths", "16", "--heads", "1", "--head-dim", "16", "--min-seconds", "0.001",
          "--repetitions", "1"]
# (name, command before the flag, the flag): every flag libra writes a file for.
OUTPUTS = [
    ("plan -o", GQA, "-o"),
    ("pack -o", ["pack", "data/corpus/lengths.txt", "--seq-len", "1000"], "-o"),
    ("place -o", ["place", "data/placement/small.jsonl", "--gbs", "4", "--pool-size", "2"], "-o"),
    ("simulate -o", SIM, "-o"),
    ("simulate --config-out", SIM, "--config-out"),
    ("simulate --elastic -o", ELASTIC, "-o"),
    ("exec --trace", EXEC, "--trace"),
    ("bench kernel --profile-out", KERNEL, "--profile-out"),
]
failures = []


def run(libra, args):
    p = subprocess.run([libra] + args, cwd=HERE, capture_output=True, text=True, timeout=120)
    return p.returncode, p.stderr


def expect(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what)


def one_line(err):
    return err.count("\n") == 1


def kind(path):
    return stat.S_IFMT(os.lstat(path).st_mode)


def check_symlink(libra, name, cmd, flag, tmp):
    target = os.path.join(tmp, "target.out")
    with open(target, "w") as f:
        f.write("old")
    os.chmod(target, 0o600)
    link = os.path.join(tmp, "link.out")
    os.symlink("target.out", link)
    rc, err = run(libra, cmd + [flag, link])
    expect(rc == 0, "%s to a symlink: exit %d: %s" % (name, rc, err))
    expect(kind(link) == stat.S_IFLNK, "%s replaced the symlink" % name)
    expect(open(target, "rb").read() not in (b"", b"old"), "%s did not write through the symlink" % name)
    expect(stat.S_IMODE(os.stat(target).st_mode) == 0o600, "%s did not keep the target's mode 0600" % name)


def check_fifo(libra, name, cmd, flag, tmp):
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    rc, err = run(libra, cmd + [flag, fifo])
    # The work is done before the write finds no reader: a note of the
    # command's may come first; the error is the one last line.
    lines = err.splitlines()
    expect(rc == 2 and lines and "a FIFO with no reader" in lines[-1] and err.count("error:") == 1,
           "%s to a FIFO without a reader: exit %d: %s" % (name, rc, err))
    got = []
    reader = threading.Thread(target=lambda: got.append(open(fifo, "rb").read()))
    reader.start()
    rc, err = 2, ""
    for _ in range(50):  # until the reader has opened its end
        rc, err = run(libra, cmd + [flag, fifo])
        if rc != 2 or "no reader" not in err:
            break
    if reader.is_alive():
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # lets the reader go
    reader.join()
    expect(rc == 0 and got and len(got[0]) > 0, "%s to a FIFO with a reader: exit %d: %s" % (name, rc, err))
    expect(kind(fifo) == stat.S_IFIFO, "%s replaced the FIFO" % name)


def check_device(libra, name, cmd, flag, tmp):
    dev = os.path.join(tmp, "null")
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the null device, our own node
    except PermissionError:
        return
    rc, err = run(libra, cmd + [flag, dev])
    expect(rc == 0, "%s to a character device: exit %d: %s" % (name, rc, err))
    expect(kind(dev) == stat.S_IFCHR, "%s replaced the character device" % name)


def check_socket(libra, name, cmd, flag, tmp):
    path = os.path.join(tmp, "sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    rc, err = run(libra, cmd + [flag, path])
    expect(rc == 2 and one_line(err) and "is a socket" in err, "%s to a socket: exit %d: %s" % (name, rc, err))
    expect(kind(path) == stat.S_IFSOCK, "%s replaced the socket" % name)
    s.close()


def check_collisions(libra, tmp):
    out = os.path.join(tmp, "same.out")
    report = os.path.join(tmp, "report")
    os.mkdir(report)
    os.symlink("same.out", os.path.join(tmp, "alias.out"))
    cases = [
        (SIM + ["-o", out, "--config-out", out], "is also"),
        (SIM + ["-o", out, "--config-out", os.path.join(tmp, "alias.out")], "is also"),
        (SIM + ["-o", "-", "--config-out", "-"], "standard output is also"),
        (SIM + ["--report", report, "-o", os.path.join(report, "result.json")], "inside the --report directory"),
        (SIM + ["--report", report, "--config-out", os.path.join(report, "index.md")], "inside the --report directory"),
        (SIM + ["--report", out, "-o", out], "is also"),
    ]
    for args, part in cases:
        rc, err = run(libra, args)
        expect(rc == 2 and one_line(err) and part in err, "collision %s: exit %d: %s" % (" ".join(args), rc, err))
    expect(not os.path.exists(out) and os.listdir(report) == [], "a refused collision wrote a file")


def main():
    libra = os.path.abspath(sys.argv[1])
    for name, cmd, flag in OUTPUTS:
        for check in (check_symlink, check_fifo, check_device, check_socket):
            with tempfile.TemporaryDirectory() as tmp:
                check(libra, name, cmd, flag, tmp)
    with tempfile.TemporaryDirectory() as tmp:
        check_collisions(libra, tmp)
    print("%d failure(s) over %d output flags" % (len(failures), len(OUTPUTS)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
