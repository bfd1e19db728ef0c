#!/usr/bin/python3
"""One python process that imports torch once and runs the PyTorch reference for every C++ test.

The C++ reference tests (test_reference.cpp) each run tests/reference/attnres_ref.py: about 80
runs in `make test`, each spending about 1 CPU second importing torch and numpy before its work
(0.1 s for a float64 run, 2-3 s with --rounding-trials, nothing on a --cache hit). This server
imports them once. For each request it forks, and the child runs attnres_ref.main() on the
request's arguments, exactly as the command line does (the same code, the same --cache), and
answers with its exit status and output. Forking after the imports is safe: importing torch starts
no threads (checked at start), and the server itself computes nothing.

  ref_server.py start SOCKET   start the server in the background (its log: SOCKET.log); returns
                               once it answers. One already answering on SOCKET (an interrupted
                               ctest's, whose attnres_ref.py may be older) is stopped first.
  ref_server.py stop SOCKET    stop it once its requests are done; prints the CPU seconds it and
                               its requests used (they are not the caller's children: `time ctest`
                               does not count them)

Neither imports torch. CTest runs them as the fixture of the reference tests
(tests/reference/CMakeLists.txt). When no server answers (a test run by itself, a socket path
longer than a Unix socket allows), the C++ test runs attnres_ref.py itself, as before. An idle
server exits after IDLE_SECONDS (ctest interrupted before the fixture's cleanup).

Protocol (a Unix stream socket): the client sends the arguments of attnres_ref.py, each followed
by a NUL byte, and shuts its side down; the server answers "<exit status>\\n" and the run's output
(stdout and stderr, with the traceback when it raised), then closes. The request "--stop" stops it.
"""
import contextlib
import io
import os
import socket
import sys
import traceback

IDLE_SECONDS = 600
MAX_PATH = 107  # sockaddr_un.sun_path, less its terminating NUL
STOP = "--stop"


def _connect(path, timeout):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    try:
        s.connect(path)
    except OSError:
        s.close()
        return None
    return s


def _receive_all(conn):
    data = b""
    while chunk := conn.recv(65536):
        data += chunk
    return data


def _serve_one(conn, args):
    """In the forked child: runs attnres_ref.main on the request's arguments and answers."""
    import attnres_ref

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            status = attnres_ref.main(args)
        except SystemExit as e:  # argparse's errors
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:  # noqa: BLE001 (the client prints it)
            traceback.print_exc()
            status = 1
    conn.sendall(f"{status or 0}\n{out.getvalue()}".encode())
    conn.close()


def serve(path, ready_fd):
    """The server (a grandchild of `start`, in a session of its own, writing to SOCKET.log)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import attnres_ref  # noqa: F401 (torch and numpy: imported once, here)
    import rounding  # noqa: F401 (attnres_ref.main imports it for --rounding-trials)

    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:  # a process with threads (an OpenMP pool) cannot fork safely
        print(f"ref_server: {threads} threads after importing torch; not serving", flush=True)
        return 1
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)  # a stale socket: `start` found nobody answering on it
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.settimeout(IDLE_SECONDS)
    print(f"ref_server: serving on {path} (pid {os.getpid()})", flush=True)
    os.write(ready_fd, b"y")
    os.close(ready_fd)
    children, served, stopper = set(), 0, None
    while True:
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            print(f"ref_server: idle for {IDLE_SECONDS} s; exiting", flush=True)
            break
        conn.settimeout(None)
        args = [a.decode() for a in _receive_all(conn).split(b"\0")[:-1]]
        if not args:  # `start`'s probe
            conn.close()
            continue
        if args == [STOP]:
            stopper = conn  # answered once every request is done
            break
        pid = os.fork()
        if pid == 0:
            listener.close()
            try:
                _serve_one(conn, args)
            finally:
                os._exit(0)
        conn.close()
        served += 1
        children.add(pid)
        for child in list(children):  # reap those that ended
            if os.waitpid(child, os.WNOHANG)[0]:
                children.discard(child)
    listener.close()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    for child in children:
        os.waitpid(child, 0)
    usage = os.times()
    summary = (f"ref_server: stopped after {served} requests; CPU seconds: the server "
               f"{usage.user + usage.system:.2f}, its requests {usage.children_user + usage.children_system:.2f} "
               f"({usage.children_user:.2f} user, {usage.children_system:.2f} system)")
    print(summary, flush=True)
    if stopper is not None:
        stopper.sendall(f"0\n{summary}\n".encode())
        stopper.close()
    return 0


def start(path):
    if len(os.fsencode(path)) > MAX_PATH:
        print(f"ref_server: {path} is longer than a Unix socket's {MAX_PATH} bytes: "
              "each reference test runs attnres_ref.py itself")
        return 0
    probe = _connect(path, timeout=10)
    if probe is not None:  # one left by an interrupted ctest, maybe with older code: replaced
        probe.close()
        print(f"ref_server: replacing the server on {path}")
        stop(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        # Detached from the caller: a session of its own, and none of its stdout/stderr pipes
        # (ctest waits for a test's pipes to close, not only for its process to exit).
        os.close(read_fd)
        os.setsid()
        log = os.open(path + ".log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(null)
        os.close(log)
        if os.fork() != 0:  # the grandchild serves, the caller reaps this child
            os._exit(0)
        try:
            status = serve(path, write_fd)
        except BaseException:  # noqa: BLE001 (in its log)
            traceback.print_exc()
            status = 1
        os._exit(status)
    os.close(write_fd)
    os.waitpid(pid, 0)
    ready = os.read(read_fd, 1)  # b"" when the server ended without serving
    os.close(read_fd)
    if ready != b"y":
        print(f"ref_server: the server did not start (its log: {path}.log): "
              "each reference test runs attnres_ref.py itself")
        return 0
    print(f"ref_server: serving on {path}")
    return 0


def stop(path):
    s = _connect(path, timeout=60)
    if s is None:
        print(f"ref_server: nothing serves on {path}")
        return 0
    s.settimeout(None)  # it answers once its running requests are done
    s.sendall(STOP.encode() + b"\0")
    s.shutdown(socket.SHUT_WR)
    print(_receive_all(s).decode(errors="replace").partition("\n")[2], end="")
    s.close()
    return 0


def main(argv):
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        print(__doc__)
        return 2
    return start(argv[1]) if argv[0] == "start" else stop(argv[1])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
