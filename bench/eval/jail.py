"""The sandbox's inside: run as a script (`python -I -S -B jail.py`, standard library only) with one JSON line on
stdin (the program, the paths it may read, its limits); the rest of stdin and stdout/stderr are the program's.

Linux only. In new mount, network, PID and IPC namespaces (and a user namespace when not root), the program sees a
root of its own: a read-only tmpfs holding read-only binds of the interpreter, the system libraries and the paths
asked for, and a small writable tmpfs /scratch, its current folder. The network namespace has only a loopback that is
down. The program runs as PID 1 of its namespace, so when it ends, or is killed, every process it forked ends too.
Before its code runs it loses every privilege: as root it becomes nobody (65534), otherwise it keeps no
capability; no new privileges; CPU-seconds, address space, file size, open files and processes are limited.
Exit 97 with a line `sandbox: ...` on stderr: the jail could not be built, and nothing ran.
"""

import ctypes
import json
import os
import resource
import signal
import sys

CANNOT = 97
NEWNS, NEWIPC, NEWUSER, NEWPID, NEWNET = 0x00020000, 0x08000000, 0x10000000, 0x20000000, 0x40000000
RDONLY, NOSUID, NODEV, NOEXEC, REMOUNT, BIND, REC, PRIVATE = 1, 2, 4, 8, 32, 4096, 16384, 1 << 18
PR_SET_PDEATHSIG, PR_CAPBSET_DROP, PR_SET_SECUREBITS, PR_SET_NO_NEW_PRIVS = 1, 24, 28, 38
NOBODY = 65534
# The jail's root is built on a folder mounted over in its own mount namespace only: everything under that folder
# disappears from the jail, so it is the first of these that holds none of the paths to bind (a venv under /tmp
# would otherwise vanish, and the programs' imports with it).
ROOTS = ("/tmp", "/mnt", "/srv", "/media", "/opt")
ROOT = ROOTS[0]
WORK = "/scratch"  # the program's folder, inside the root
libc = ctypes.CDLL(None, use_errno=True)


def fail(what: str) -> None:
    sys.stderr.write(f"sandbox: {what}: {os.strerror(ctypes.get_errno()) if ctypes.get_errno() else ''}\n")
    sys.stderr.flush()
    os._exit(CANNOT)


def call(fn, *args, what: str) -> None:
    if fn(*args) != 0:
        fail(what)


def enc(text: str | None) -> bytes | None:
    return None if text is None else text.encode()


def mount(src, target, fstype, flags, data=None, what="mount") -> None:
    call(libc.mount, enc(src), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data), what=f"{what} {target}")


def kept_flags(path: str) -> int:
    """The flags a read-only remount of a bind must keep (a user namespace may not clear them)."""
    f = os.statvfs(path).f_flag
    return sum(bit for st, bit in ((os.ST_NOSUID, NOSUID), (os.ST_NODEV, NODEV), (os.ST_NOEXEC, NOEXEC)) if f & st)


def bind(src: str, inside: str) -> None:
    target = ROOT + inside
    if os.path.islink(src):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.lexists(target):
            os.symlink(os.readlink(src), target)
        return
    if os.path.isdir(src):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        open(target, "a").close()
    mount(src, target, None, BIND | REC, what="bind")
    mount(None, target, None, REMOUNT | BIND | RDONLY | kept_flags(src), what="read-only")


def root_for(paths: list[str]) -> str:
    """The first of ROOTS that is a folder and holds none of `paths`."""
    for root in ROOTS:
        if os.path.isdir(root) and not any(p == root or p.startswith(root + "/") for p in paths):
            return root
    fail(f"every folder the jail can be built on ({', '.join(ROOTS)}) holds a path it must read")
    raise AssertionError  # fail() exits


def build_root(job: dict) -> None:
    global ROOT
    ROOT = root_for([os.path.realpath(p) for p in ["/usr", "/lib", "/lib64", "/bin", sys.base_prefix,
                                                     *job.get("paths", [])]])
    mount(None, "/", None, REC | PRIVATE, what="private")
    mount("tmpfs", ROOT, "tmpfs", NOSUID | NODEV, "size=4m,mode=755", what="root tmpfs")
    seen: list[str] = []
    if any(p == WORK or p.startswith(WORK + "/") for p in job.get("paths", [])):
        fail(f"a path to read lies under the program's folder {WORK}")
    for path in ["/usr", "/lib", "/lib64", "/bin", sys.base_prefix, *job.get("paths", [])]:
        if os.path.lexists(path) and not any(path == s or path.startswith(s.rstrip("/") + "/") for s in seen):
            bind(path, path)
            seen.append(path)
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
        bind(dev, dev)
    os.makedirs(ROOT + WORK)
    mount("tmpfs", ROOT + WORK, "tmpfs", NOSUID | NODEV, f"size={job['work_bytes']},mode=777", what="work tmpfs")
    with open(ROOT + WORK + "/main.py", "w") as f:
        f.write(job["program"])
    mount(None, ROOT, None, REMOUNT | RDONLY | NOSUID | NODEV, what="root read-only")
    os.chroot(ROOT)
    os.chdir(WORK)


def drop_privileges(as_root: bool) -> None:
    if as_root:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)  # from root to nobody: every capability goes
    else:  # uid 0 of our own user namespace: no capability, and none given back on exec
        call(libc.prctl, PR_SET_SECUREBITS, 0x0F, 0, 0, 0, what="securebits")
        last = int(open("/proc/sys/kernel/cap_last_cap").read()) if os.path.exists("/proc/sys/kernel/cap_last_cap") \
            else 40
        for cap in range(last + 1):
            libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0)
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        call(libc.capset, header, data, what="capset")
    call(libc.prctl, PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0, what="no new privileges")


def limit(job: dict) -> None:
    resource.setrlimit(resource.RLIMIT_CPU, (job["cpu_s"], job["cpu_s"] + 1))  # SIGXCPU, then SIGKILL
    for which, value in ((resource.RLIMIT_AS, job["memory_bytes"]), (resource.RLIMIT_FSIZE, job["work_bytes"]),
                         (resource.RLIMIT_NOFILE, 64), (resource.RLIMIT_NPROC, job["processes"]),
                         (resource.RLIMIT_CORE, 0)):
        resource.setrlimit(which, (value, value))


def main() -> None:
    line = b""
    while not line.endswith(b"\n"):  # byte by byte: what follows the line is the program's
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    job = json.loads(line)
    uid, gid = os.getuid(), os.getgid()
    as_root = uid == 0
    if as_root:
        call(libc.unshare, NEWNS | NEWNET | NEWPID | NEWIPC, what="unshare")
    else:
        call(libc.unshare, NEWUSER | NEWNS | NEWNET | NEWPID | NEWIPC, what="unshare (user namespace)")
        for name, text in (("setgroups", "deny"), ("uid_map", f"0 {uid} 1"), ("gid_map", f"0 {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(text)
    python = os.path.realpath(sys.executable)
    child = os.fork()
    if child == 0:  # PID 1 of the new PID namespace
        call(libc.prctl, PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0, what="parent-death signal")
        build_root(job)
        program = os.fork()  # not PID 1 itself: PID 1 ignores the signals of the CPU limit
        if program == 0:
            drop_privileges(as_root)
            limit(job)
            os.execv(python, [python, "-I", "-S", "-B", "main.py", *job.get("args", [])])
        os._exit(exit_code(os.waitpid(program, 0)[1]))  # and with PID 1 every process of the namespace ends
    signal.signal(signal.SIGALRM, lambda *_: os.kill(child, signal.SIGKILL))
    signal.alarm(max(1, int(job["wall_s"])))
    os._exit(exit_code(os.waitpid(child, 0)[1]))


def exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    main()
