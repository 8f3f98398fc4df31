#!/usr/bin/env python3
"""What one encoding of a LIST costs the API server against another.

Lists the ConfigMaps of one namespace of the local control plane (tests/cluster/cluster.sh,
started if it is not running) from the API server's watch cache (resourceVersion=0), in JSON
and in protobuf (application/vnd.kubernetes.protobuf) by turns, and prints the API server's
CPU time (user and system, from /proc) for each turn, the medians, and their ratio. The
namespace is filled with OBJECTS ConfigMaps of 2 KiB first, as the benchmarks make them, and
kept for the next run (make cluster-down removes it).

Usage: bench/encoding.py [--objects N] [--lists-per-turn L] [--turns T]
Example: bench/encoding.py --objects 10000 --lists-per-turn 5 --turns 8

Only the API server's side is measured: what a client spends decoding either encoding is not.
"""

import argparse
import concurrent.futures
import http.client
import json
import os
import re
import ssl
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
NAMESPACE = "kd-bench-encoding"
ENCODINGS = ("application/json", "application/vnd.kubernetes.protobuf")


class ApiServer:
    """The local control plane's API server, reached as its admin."""

    def __init__(self, cluster: Path):
        kubeconfig = (cluster / "kubeconfig").read_text()
        server = re.search(r"server: https://([^:\s]+):(\d+)", kubeconfig)
        token = re.search(r"token: (\S+)", kubeconfig)
        ca = re.search(r"certificate-authority: (\S+)", kubeconfig)
        if not (server and token and ca):
            sys.exit(f"encoding: cannot read the server, token and CA of {cluster}/kubeconfig")
        self.host, self.port = server.group(1), int(server.group(2))
        self.token = token.group(1)
        self.context = ssl.create_default_context(cafile=ca.group(1))
        state = (cluster / "state.env").read_text()
        self.pid = int(re.search(r"APISERVER_PID=(\d+)", state).group(1))

    def connection(self) -> http.client.HTTPSConnection:
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=120)

    def call(self, connection, method, path, body=None, accept="application/json"):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        if body is not None:
            headers["Content-Type"] = "application/json"
            body = json.dumps(body)
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        data = response.read()
        if response.status >= 400 and response.status != 409:
            sys.exit(f"encoding: {method} {path}: {response.status} {data[:200]!r}")
        return response.status, data

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fill(api: ApiServer, objects: int) -> None:
    """Creates the namespace and ConfigMaps 0..objects that it lacks."""
    connection = api.connection()
    api.call(connection, "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps"
    _, data = api.call(connection, "GET", f"{path}?limit=1")
    listed = json.loads(data)
    have = len(listed["items"]) + listed["metadata"].get("remainingItemCount", 0)
    if have >= objects:
        return

    def create(names):
        own = api.connection()
        for i in names:
            body = {"metadata": {"name": f"cm-{i}"}, "data": {"value": "x" * 2048}}
            api.call(own, "POST", path, body)

    workers = 8
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        list(pool.map(create, [range(k, objects, workers) for k in range(workers)]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--objects", type=int, default=10000, help="ConfigMaps listed (10000)")
    parser.add_argument("--lists-per-turn", type=int, default=5, help="LISTs in one turn (5)")
    parser.add_argument("--turns", type=int, default=8, help="turns of each encoding (8)")
    args = parser.parse_args()
    cluster = Path(os.environ.get("KD_CLUSTER_DIR", ROOT / ".cluster"))
    subprocess.run([ROOT / "tests/cluster/cluster.sh", "up"], check=True, stdout=subprocess.DEVNULL)
    api = ApiServer(cluster)
    fill(api, args.objects)
    path = f"/api/v1/namespaces/{NAMESPACE}/configmaps?resourceVersion=0"
    spent = {encoding: [] for encoding in ENCODINGS}
    for turn in range(args.turns):
        for encoding in ENCODINGS:
            connection = api.connection()
            before = api.cpu_seconds()
            for _ in range(args.lists_per_turn):
                _, data = api.call(connection, "GET", path, accept=encoding)
            # The API server's threads account their time when they next run: let them.
            time.sleep(0.3)
            spent[encoding].append(api.cpu_seconds() - before)
            print(f"turn {turn + 1}: {encoding:<38} {args.lists_per_turn} LISTs of {args.objects} objects, "
                  f"{len(data) / 1e6:.1f} MB each: API server CPU {spent[encoding][-1]:.2f} s")
    medians = {encoding: statistics.median(s) for encoding, s in spent.items()}
    json_s, protobuf_s = medians[ENCODINGS[0]], medians[ENCODINGS[1]]
    print(f"median of {args.turns} turns: JSON {json_s:.2f} s, protobuf {protobuf_s:.2f} s "
          f"({json_s / protobuf_s:.2f}x); per object listed: {json_s / args.lists_per_turn / args.objects * 1e6:.1f} "
          f"and {protobuf_s / args.lists_per_turn / args.objects * 1e6:.1f} us")


if __name__ == "__main__":
    main()
