"""The three servers under load and under attack: latency with 1, 8 and 16 concurrent clients, and how fast
each kind of refusal comes back (issue 28).

    python benchmarks/servers_load.py            # builtin:tiny, ~2 minutes on a shared 2-core machine
    python benchmarks/servers_load.py --json

Started as a user starts them (each in its own process on loopback, with tokens): `wai policy builtin:tiny
--threads 1`, `wai record` in front of it, and `wai serve`. Latency: each client sends completions
(3 prompt tokens, 8 new tokens, the token as api_key) through the recorder, back to back, for ``--seconds``;
reported per client count: requests per second, p50 / p95 / max latency. The same for `wai serve`'s `noop`
operation (one run per client). Refusals, each timed from the first byte sent to the answer: a 100 MiB body
streamed without a Content-Length, the same declared in Content-Length (headers only: the server's own time),
a 900 KB text prompt (inside the body
limit, far past the context), an out-of-vocabulary id, no token. The server's RSS is read before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

MiB = 2**20


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def load(send: Any, clients: int, seconds: float) -> dict[str, float]:
    """``clients`` threads each calling ``send(k)`` back to back for ``seconds``: rate and latency percentiles."""
    latencies: list[float] = []
    failures: list[str] = []
    stop = time.monotonic() + seconds

    def worker(k: int) -> None:
        while time.monotonic() < stop:
            began = time.perf_counter()
            try:
                send(k)
            except Exception as err:  # noqa: BLE001 - counted and reported
                failures.append(repr(err))
                continue
            latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.perf_counter() - began
    latencies.sort()
    pick = (lambda q: latencies[min(len(latencies) - 1, int(q * len(latencies)))]) if latencies else (lambda q: 0.0)
    return {"clients": clients, "requests": len(latencies), "failures": len(failures), "per_s": len(latencies) / took,
            "p50_ms": 1000 * pick(0.5), "p95_ms": 1000 * pick(0.95), "max_ms": 1000 * (latencies[-1] if latencies
                                                                                      else 0.0)}


def streamed(total: int) -> Iterator[bytes]:
    yield b'{"prompt": "'
    for _ in range(total // MiB):
        yield b"a" * MiB
    yield b'"}'


def refusal(url: str, pid: int, headers: dict[str, str], **request: Any) -> dict[str, Any]:
    before = rss_mb(pid)
    began = time.perf_counter()
    reply = httpx.post(url, headers=headers, timeout=120, **request)
    took = time.perf_counter() - began
    return {"status": reply.status_code, "ms": 1000 * took, "rss_growth_mb": rss_mb(pid) - before,
            "message": reply.text[:110]}


def declared(url: str, headers: dict[str, str], size: int) -> dict[str, Any]:
    """Headers declaring a ``size``-byte body, then nothing: how long the server takes to refuse it (a client
    library would spend its own time writing the body first)."""
    parsed = httpx.URL(url)
    lines = [f"POST {parsed.raw_path.decode()} HTTP/1.1", f"Host: {parsed.host}:{parsed.port}",
             f"Content-Length: {size}", "Content-Type: application/json",
             *(f"{k}: {v}" for k, v in headers.items())]
    began = time.perf_counter()
    with socket.create_connection((parsed.host, parsed.port), timeout=60) as sock:
        sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
        answer = sock.recv(4096).decode(errors="replace")
    took = time.perf_counter() - began
    return {"status": int(answer.split()[1]), "ms": 1000 * took, "rss_growth_mb": 0.0, "message": answer[-110:]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds of load per client count (default 10)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    from whileai.record.launch import Started
    from whileai.service.launch import start_server

    result: dict[str, Any] = {"machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
                              "load_before": os.getloadavg()[0]}
    with tempfile.TemporaryDirectory() as tmp, \
            Started(["policy", "builtin:tiny", "--threads", "1"], Path(tmp)) as policy, \
            Started(["record", "--upstream", policy.url, "--data-dir", f"{tmp}/record"], Path(tmp)) as recorder, \
            start_server(Path(tmp) / "serve") as serve:
        auth = recorder.headers
        ask = {"model": "builtin:tiny", "prompt": [1, 72, 105], "max_tokens": 8, "seed": 0}
        with httpx.Client(timeout=120, headers=auth) as http:
            result["recorder"] = [load(lambda k: http.post(recorder.url + "/v1/completions", json=ask)
                                       .raise_for_status(), n, args.seconds) for n in (1, 8, 16)]
        serve_auth = {"authorization": f"Bearer {serve.token}"}
        with httpx.Client(timeout=120, headers=serve_auth) as http:
            session = http.post(serve.url + "/v1/training/sessions").json()["session_id"]
            runs = [http.post(f"{serve.url}/v1/training/sessions/{session}/runs", json={"base_model": "builtin:tiny"})
                    .json()["run_id"] for _ in range(16)]
            seqs = [0] * 16
            lock = threading.Lock()

            def noop(k: int) -> None:
                with lock:
                    seq = seqs[k]
                    seqs[k] += 1
                http.post(f"{serve.url}/v1/training/runs/{runs[k]}/noop", json={"seq_id": seq}).raise_for_status()

            result["serve_noop"] = [load(noop, n, args.seconds) for n in (1, 8, 16)]
        refusals = {}
        for name, server, path, headers in [("policy", policy, "/v1/completions", policy.headers),
                                            ("record", recorder, "/v1/completions", recorder.headers),
                                            ("serve", serve, f"/v1/training/runs/{runs[0]}/forward", serve_auth)]:
            url, pid = server.url + path, server.process.pid
            refusals[f"{name}: 100 MiB streamed"] = refusal(url, pid, headers, content=streamed(100 * MiB))
            refusals[f"{name}: 100 MiB declared"] = declared(url, headers, 100 * MiB)
            refusals[f"{name}: no token"] = refusal(url, pid, {}, json={"prompt": [1]})
        refusals["policy: 900 KB text prompt"] = refusal(policy.url + "/v1/completions", policy.process.pid,
                                                         policy.headers, json={"prompt": "a" * 900_000})
        refusals["policy: out-of-vocab id"] = refusal(policy.url + "/v1/completions", policy.process.pid,
                                                      policy.headers, json={"prompt": [1, 10**6]})
        result["refusals"] = refusals
    result["load_after"] = os.getloadavg()[0]
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{result['machine']}, load average {result['load_before']:.1f} -> {result['load_after']:.1f}")
    for what in ("recorder", "serve_noop"):
        for row in result[what]:
            print(f"  {what:10s} {row['clients']:2d} clients: {row['per_s']:6.1f} req/s  p50 {row['p50_ms']:7.1f} ms  "
                  f"p95 {row['p95_ms']:7.1f} ms  max {row['max_ms']:7.1f} ms  failures {row['failures']}")
    for name, row in result["refusals"].items():
        print(f"  {name:28s} {row['status']} in {row['ms']:7.1f} ms, RSS {row['rss_growth_mb']:+.0f} MiB")


if __name__ == "__main__":
    main()
