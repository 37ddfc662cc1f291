"""In-sandbox supervisor: exec server + Gateway loopback forwarder. Stdlib only.

Why it exists: it is copied into every local/docker sandbox and started as the
sandbox's long-lived process, so the host can
  * run commands (streamed, killable as a whole process group, with timeouts) over a
    Unix socket in the bind-mounted run dir — no `docker exec`/`nsenter` per command,
    and cancellation really kills the agent's whole tree;
  * move files as tar streams, extracted/created *as the sandbox user*;
  * expose the Gateway inside the sandbox at http://127.0.0.1:PORT by forwarding each
    loopback connection to the bind-mounted Gateway Unix socket (the sandbox has no
    route out, so this is the only way to the Gateway), and each allowlisted host on
    its own loopback address the same way (`egress_relay`);
  * kill every process the agent left behind before the evaluation runs.
It must run with only what the sandbox has: any Python 3.8+, nothing else.

The agent runs as the same uid, so the supervisor makes itself non-dumpable (no
ptrace, no /proc/<pid>/fd or mem access by the agent), and the host moves the control
socket out of the sandbox's run dir as soon as it is bound (`secure_control_socket`).

Wire protocol on ``<run-dir>/control.sock``: the client sends one JSON line; then
  exec:  frames ``type(1) len(4, big-endian) payload`` both ways. Server→client:
         O stdout, E stderr, X exit (JSON). Client→server: I stdin, C close stdin,
         K kill. A client disconnect kills the process group.
  put:   raw tar bytes until the client half-closes; server answers one JSON line.
  get:   server answers one JSON line, then raw tar bytes until EOF.
  kill_all / forward / ping: one JSON line each way.
"""

import contextlib
import ctypes
import errno
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

HDR = struct.Struct(">cI")
CHUNK = 65536
#: Reads a stopping pump still makes (what a background writer adds meanwhile).
DRAIN_CHUNKS = 16


class Reaper:
    """Sole caller of waitpid(): collects our children and any reparented orphans."""

    def __init__(self):
        self.lock = threading.Lock()
        self.status = {}  # pid -> raw wait status
        self.waiters = {}  # pid -> Event
        self.kick = threading.Event()
        threading.Thread(target=self._loop, daemon=True).start()

    def register(self, pid):
        with self.lock:
            ev = self.waiters.setdefault(pid, threading.Event())
            if pid in self.status:
                ev.set()
        self.kick.set()
        return ev

    def pop(self, pid):
        with self.lock:
            self.waiters.pop(pid, None)
            return self.status.pop(pid)

    def _loop(self):
        while True:
            try:
                pid, st = os.waitpid(-1, 0)
            except ChildProcessError:
                self.kick.wait(1.0)
                self.kick.clear()
                continue
            except InterruptedError:
                continue
            with self.lock:
                if pid in self.waiters or len(self.status) < 10000:
                    self.status[pid] = st
                ev = self.waiters.get(pid)
            if ev is not None:
                ev.set()
            else:
                # Orphan or not-yet-registered child: keep its status briefly.
                threading.Timer(30.0, self._drop, (pid,)).start()

    def _drop(self, pid):
        with self.lock:
            if pid not in self.waiters:
                self.status.pop(pid, None)


REAPER = None


def send_frame(sock, lock, kind, payload):
    with lock:
        sock.sendall(HDR.pack(kind, len(payload)) + payload)


def recv_exact(sock, n):
    buf = b""
    while len(buf) < n:
        got = sock.recv(n - len(buf))
        if not got:
            return None
        buf += got
    return buf


def read_line(sock):
    buf = b""
    while not buf.endswith(b"\n"):
        got = sock.recv(1)
        if not got:
            break
        buf += got
        if len(buf) > 16 * 1024 * 1024:
            raise ValueError("header too long")
    return buf


def killpg(pid):
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def handle_exec(sock, req):
    argv = req["argv"]
    env = req.get("env") or {}
    cwd = req.get("cwd") or None
    timeout = req.get("timeout")
    wlock = threading.Lock()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE if req.get("stdin") else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    except OSError as e:
        code = 127 if e.errno in (errno.ENOENT, errno.ENOTDIR) else 126
        msg = (f"exec failed: {e}\n").encode()
        send_frame(sock, wlock, b"E", msg)
        send_frame(
            sock, wlock, b"X", json.dumps({"exit_code": code, "spawn_error": str(e)}).encode()
        )
        return
    done = REAPER.register(proc.pid)
    state = {"killed": False, "timed_out": False}

    # Written once the command has exited and its grace period is over: each pump then
    # sends what is already in its pipe and stops, so the exit frame never overtakes
    # output the command wrote (however late the pump thread gets scheduled).
    stop_r, stop_w = os.pipe()

    def pump(stream, kind):
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.register(stop_r, select.POLLIN)
        after_stop = 0
        try:
            while True:
                ready = {f for f, _ in poller.poll()}
                stopping = stop_r in ready
                if stopping and fd not in ready:
                    break  # nothing left that the command wrote
                data = os.read(fd, CHUNK)
                if not data:
                    break
                send_frame(sock, wlock, kind, data)
                if stopping:
                    after_stop += 1
                    if after_stop >= DRAIN_CHUNKS:
                        break  # a background child that keeps writing
        except OSError:
            pass
        finally:
            stream.close()

    pumps = [
        threading.Thread(target=pump, args=(proc.stdout, b"O"), daemon=True),
        threading.Thread(target=pump, args=(proc.stderr, b"E"), daemon=True),
    ]
    for t in pumps:
        t.start()

    def reader():
        # Client → server: stdin data, close, kill; EOF (client gone) kills.
        try:
            while True:
                hdr = recv_exact(sock, HDR.size)
                if hdr is None:
                    break
                kind, n = HDR.unpack(hdr)
                payload = recv_exact(sock, n) if n else b""
                if payload is None:
                    break
                if kind == b"I" and proc.stdin:
                    try:
                        proc.stdin.write(payload)
                        proc.stdin.flush()
                    except OSError:
                        pass
                elif kind == b"C" and proc.stdin:
                    with contextlib.suppress(OSError):
                        proc.stdin.close()
                elif kind == b"K":
                    state["killed"] = True
                    killpg(proc.pid)
                    return
        except OSError:
            pass
        if not done.is_set():
            state["killed"] = True
            killpg(proc.pid)

    threading.Thread(target=reader, daemon=True).start()
    if not done.wait(timeout if timeout else None):
        state["timed_out"] = True
        killpg(proc.pid)
        done.wait()
    st = REAPER.pop(proc.pid)
    proc.returncode = 0  # we reaped it; stop Popen from waiting again
    # Background children may hold the pipes: give them a moment, then stop reading once
    # the pipes hold nothing more.
    grace = time.monotonic() + (0.5 if not state["timed_out"] else 2.0)
    for t in pumps:
        t.join(max(0.0, grace - time.monotonic()))
    os.write(stop_w, b"x")
    for t in pumps:
        t.join()
    os.close(stop_r)
    os.close(stop_w)
    if state["timed_out"] or state["killed"]:
        killpg(proc.pid)
    if os.WIFSIGNALED(st):
        sig = os.WTERMSIG(st)
        res = {"exit_code": 128 + sig, "signal": sig}
    else:
        res = {"exit_code": os.WEXITSTATUS(st)}
    res["timed_out"] = state["timed_out"]
    res["killed"] = state["killed"]
    with contextlib.suppress(OSError):
        send_frame(sock, wlock, b"X", json.dumps(res).encode())


class SockReader:
    """File-like view of a socket for tarfile streaming."""

    def __init__(self, sock):
        self.sock = sock

    def read(self, n=-1):
        if n is None or n < 0:
            n = CHUNK
        return self.sock.recv(n)


class SockWriter:
    def __init__(self, sock):
        self.sock = sock

    def write(self, data):
        self.sock.sendall(data)
        return len(data)

    def flush(self):
        pass


def _safe_member(m):
    """Members named outside the destination (absolute, ``..``) or devices are skipped.

    Only the name is checked: symlinks inside the sandbox are followed like any write
    there (the supervisor has no more rights than the sandbox user), except at the
    member's own path (`_unplant`).
    """
    name = os.path.normpath(m.name)
    if os.path.isabs(name) or name == ".." or name.startswith(".." + os.sep):
        return False
    if m.islnk() and os.path.isabs(m.linkname):
        return False
    return not (m.ischr() or m.isblk() or m.isfifo())


def _unplant(dest, m):
    """Never write through what the sandbox left at a member's own path: a symlink (to
    /dev/null, say) or a FIFO there would make an evaluation file vanish or hang, a
    hard link would write into another file. Remove it; directories stay."""
    target = os.path.join(dest, m.name)
    if os.path.islink(target) or (os.path.lexists(target) and not os.path.isdir(target)):
        os.unlink(target)


def handle_put(sock, req):
    import tarfile  # lazy: see `parse_args`

    dest = req["dest"]
    try:
        os.makedirs(dest, exist_ok=True)
        n = 0
        with tarfile.open(fileobj=SockReader(sock), mode="r|") as tf:
            for m in tf:
                if not _safe_member(m):
                    continue
                _unplant(dest, m)
                m.uid = os.getuid()
                m.gid = os.getgid()
                m.uname = m.gname = ""
                if hasattr(tarfile, "fully_trusted_filter"):
                    tf.extract(m, dest, set_attrs=True, filter="fully_trusted")
                else:
                    tf.extract(m, dest, set_attrs=True)
                n += 1
        reply = {"ok": True, "members": n}
    except Exception as e:
        reply = {"ok": False, "error": f"{type(e).__name__}: {e}"}
    sock.sendall((json.dumps(reply) + "\n").encode())


def handle_get(sock, req):
    import tarfile  # lazy: see `parse_args`

    path = req["path"].rstrip("/") or "/"
    if not os.path.lexists(path):
        sock.sendall((json.dumps({"ok": False, "error": "ENOENT", "path": path}) + "\n").encode())
        return
    sock.sendall(b'{"ok": true}\n')
    with tarfile.open(fileobj=SockWriter(sock), mode="w|", format=tarfile.PAX_FORMAT) as tf:
        _add_tree(tarfile, tf, path, os.path.basename(path) or ".")


#: `sandboxes.base.UNREADABLE_PAX` (copied: this file imports only the stdlib).
UNREADABLE_PAX = "ROLLOUT.unreadable"


def _add_tree(tarfile, tf, path, arcname):
    """`tf.add(path)`, entry by entry: one that cannot be read (no permission, a path
    past PATH_MAX) goes as an empty member whose `UNREADABLE_PAX` header says why, and
    the rest of the tree still goes (the sandbox writes these trees, so one bad entry
    must not cut the stream). Iterative: a tree may be deeper than Python's recursion.
    `tarfile` is the module, imported by the caller only when a file moves."""
    todo = [(path, arcname)]
    while todo:
        path, arcname = todo.pop()
        before = tf.offset
        try:
            is_dir = os.path.isdir(path) and not os.path.islink(path)
            names = sorted(os.listdir(path), reverse=True) if is_dir else []
            tf.add(path, arcname=arcname, recursive=False)
        except OSError as e:
            if tf.offset != before:
                raise  # cut inside a member: the stream cannot go on
            info = tarfile.TarInfo(arcname)
            info.pax_headers = {UNREADABLE_PAX: f"{type(e).__name__}: {e.strerror or e}"}
            tf.addfile(info)
            continue
        todo += [(os.path.join(path, n), arcname + "/" + n) for n in names]


def _proc_table():
    """pid -> (ppid, state) of every process visible in /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        table[int(name)] = (int(fields[1]), fields[0].decode())
    return table


def _descendants(root, table):
    children = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def kill_all(own_pid_namespace, timeout=10.0):
    """SIGKILL every process started by exec (and everything they started) until none
    is left; the supervisor and its ancestors survive.

    In its own pid namespace (every sandbox backend) that is every process but init
    and us: ``kill(-1)`` reaches them all in one step, so nothing can fork away, also
    not a process that left its group or session. Without one (the supervisor run on a
    host, in tests) it is our descendants: orphans are reparented to us (we are a child
    subreaper), so a detached process stays one.
    """
    me = os.getpid()
    deadline = time.monotonic() + timeout
    killed = set()
    while True:
        table = _proc_table()
        if own_pid_namespace:
            keep = {me}
            pid = me
            while pid in table and pid > 1:
                pid = table[pid][0]
                keep.add(pid)
            keep.add(1)
            victims = [p for p, (_, st) in table.items() if p not in keep and st not in "ZX"]
            with contextlib.suppress(OSError):
                os.kill(-1, signal.SIGKILL)
        else:
            victims = [p for p in _descendants(me, table) if table[p][1] not in "ZX"]
        if not victims:
            return {"ok": True, "killed": len(killed)}
        for p in victims:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
        killed.update(victims)
        if time.monotonic() > deadline:
            return {"ok": False, "error": f"processes survived SIGKILL: {sorted(victims)[:20]}"}
        time.sleep(0.01)


FORWARDERS = {}
OWN_PID_NAMESPACE = False


def pipe(src, dst):
    try:
        while True:
            data = src.recv(CHUNK)
            if not data:
                break
            dst.sendall(data)
    except OSError:
        pass
    with contextlib.suppress(OSError):
        dst.shutdown(socket.SHUT_WR)


def serve_forward(lsock, unix_path):
    while True:
        try:
            c, _ = lsock.accept()
        except OSError:
            return
        try:
            u = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            u.connect(unix_path)
        except OSError:
            c.close()
            continue
        a = threading.Thread(target=pipe, args=(c, u), daemon=True)
        b = threading.Thread(target=pipe, args=(u, c), daemon=True)
        a.start()
        b.start()
        threading.Thread(target=_closer, args=(a, b, c, u), daemon=True).start()


def _closer(a, b, c, u):
    a.join()
    b.join()
    c.close()
    u.close()


def start_forward(port, path, addr="127.0.0.1"):
    """Listen on loopback `addr`:`port` and forward each connection to Unix `path`
    (the Gateway channel on 127.0.0.1, an allowlisted host on its own 127.x address)."""
    key = (addr, port)
    old = FORWARDERS.get(key)
    if old is not None and old[1] == path:
        return {"ok": True, "port": port, "reused": True}
    if old is not None:
        old[0].close()
    ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind((addr, port))
    ls.listen(128)
    FORWARDERS[key] = (ls, path)
    threading.Thread(target=serve_forward, args=(ls, path), daemon=True).start()
    return {"ok": True, "port": port}


def parse_forward(spec):
    """``PORT:UNIX_PATH`` (on 127.0.0.1) or ``ADDR:PORT:UNIX_PATH`` → (addr, port, path)."""
    first, rest = spec.split(":", 1)
    if "." in first:
        port, path = rest.split(":", 1)
        return first, int(port), path
    return "127.0.0.1", int(first), rest


def handle_forward(sock, req):
    try:
        reply = start_forward(int(req["port"]), req["unix"], req.get("addr") or "127.0.0.1")
    except OSError as e:
        reply = {"ok": False, "error": str(e)}
    sock.sendall((json.dumps(reply) + "\n").encode())


def handle(sock):
    try:
        line = read_line(sock)
        if not line:
            return
        req = json.loads(line)
        op = req.get("op")
        if op == "exec":
            handle_exec(sock, req)
        elif op == "put":
            handle_put(sock, req)
        elif op == "get":
            handle_get(sock, req)
        elif op == "kill_all":
            sock.sendall((json.dumps(kill_all(OWN_PID_NAMESPACE)) + "\n").encode())
        elif op == "forward":
            handle_forward(sock, req)
        elif op == "ping":
            sock.sendall((json.dumps({"ok": True, "pid": os.getpid()}) + "\n").encode())
        else:
            sock.sendall((json.dumps({"ok": False, "error": "bad op"}) + "\n").encode())
    except Exception as e:
        with contextlib.suppress(OSError):
            sock.sendall((json.dumps({"ok": False, "error": repr(e)}) + "\n").encode())
    finally:
        sock.close()


def parse_args(argv):
    """``--run-dir DIR [--forward [ADDR:]PORT:UNIX_PATH]... [--own-pid-namespace]``.

    Hand-parsed, and tarfile imported only when a file moves: this process lives in every
    sandbox, and argparse + tarfile held for its whole life cost ~1.2 MB of private memory
    per sandbox (~2.4 GB on a host holding 2,000).
    """
    run_dir, forward, own_ns = None, [], False
    it = iter(argv)
    for arg in it:
        if arg == "--own-pid-namespace":
            own_ns = True
        elif arg in ("--run-dir", "--forward"):
            value = next(it, None)
            if value is None:
                sys.exit(f"supervisor: {arg} needs a value")
            if arg == "--run-dir":
                run_dir = value
            else:
                forward.append(value)
        else:
            sys.exit(f"supervisor: unknown argument {arg!r}")
    if run_dir is None:
        sys.exit("supervisor: --run-dir is required")
    return run_dir, forward, own_ns


def main():
    global REAPER, OWN_PID_NAMESPACE
    run_dir, forward, OWN_PID_NAMESPACE = parse_args(sys.argv[1:])
    libc = ctypes.CDLL(None)
    # Collect orphans of agent process trees (we may not be PID 1).
    with contextlib.suppress(Exception):
        libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
    # Same uid as the agent: without this it could ptrace us or take our socket's fd.
    # Exec'd children are dumpable again (execve resets it).
    with contextlib.suppress(Exception):
        libc.prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    REAPER = Reaper()
    path = os.path.join(run_dir, "control.sock")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    for spec in forward:
        # Pre-started so taking a warm sandbox needs no round trip for the default port.
        addr, port, unix_path = parse_forward(spec)
        start_forward(port, unix_path, addr)
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    # 0660: a non-root docker worker is another uid, reaching it through the group.
    umask = os.umask(0o117)
    try:
        srv.bind(path)
    finally:
        os.umask(umask)
    srv.listen(256)
    with open(os.path.join(run_dir, "ready.tmp"), "w") as f:
        f.write(f"{os.getpid()} {time.time()}\n")
    os.rename(os.path.join(run_dir, "ready.tmp"), os.path.join(run_dir, "ready"))
    sys.stdout.flush()
    while True:
        try:
            c, _ = srv.accept()
        except InterruptedError:
            continue
        threading.Thread(target=handle, args=(c,), daemon=True).start()


if __name__ == "__main__":
    main()
