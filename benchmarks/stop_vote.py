"""What the per-chunk stop vote of a run over several processes costs (``drive.prepare.sharding``).

    .venv/bin/python benchmarks/stop_vote.py            # 2 processes, 2 host CPU devices each
    .venv/bin/python benchmarks/stop_vote.py --chunks 200

Starts 2 processes with ``jax.distributed`` on this machine (gloo CPU collectives), a state of
oscillators sharded over their 4 devices. In each process, timed after a warm-up:

- ``vote, read one chunk later``: votes alone, one per "chunk", chained as the run chains them (each takes the
  previous one's ``stopped``), each read after the next one is dispatched, as the run reads them;
- ``vote, read at once``: a vote dispatched and read at once (the round trip, for scale);
- ``jl.run``: a run of 10-step chunks of 4096 oscillators (the positions recorded every step
  into an HDF5 file), per chunk, with its votes (about one per ``VOTE_INTERVAL_S``);
- ``jl.run without votes``: the same run with the votes left out (``StopVote.cast`` replaced
  here by one that dispatches nothing): the difference is what the votes cost the run.

Prints per process the median over 7 interleaved repeats, in microseconds per chunk.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = textwrap.dedent("""
    import json, statistics, sys, time
    import jax
    process, port, chunks, path = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=2, process_id=process)
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
    import pytest_jaxlog as jl
    from pytest_jaxlog.drive.prepare import sharding as shards
    from pytest_jaxlog.drive.prepare.sharding import StopVote
    from kernels.oscillators import make_oscillators

    step, state, energy = make_oscillators(n=4096)
    mesh = Mesh(np.array(jax.devices()), ("d",))
    sharded = NamedSharding(mesh, P("d"))
    state = jax.tree_util.tree_map(
        lambda a: jax.make_array_from_callback(a.shape, sharded, lambda i: np.asarray(a)[i]), state)
    vote = StopVote(shards.replicated_on(state))
    stopped = shards.place(np.int32(-1), NamedSharding(mesh, P()))

    def one_behind(n):  # as the run does: each vote read one chunk after it was dispatched
        s, prev = stopped, None
        t = time.perf_counter()
        for _ in range(n):
            vote.due = 0  # a vote after every chunk
            s, v = vote.cast(s, 0, 0)
            if prev is not None:
                vote.read(prev)
            prev = v
        vote.read(prev)
        return (time.perf_counter() - t) / n

    def at_once(n):
        t = time.perf_counter()
        for _ in range(n):
            vote.due = 0
            vote.read(vote.cast(stopped, 0, 0)[1])
        return (time.perf_counter() - t) / n

    def run(n):
        t = time.perf_counter()
        jl.run(step, state, 10 * n, chunk=10, record={"x": lambda s: s.x}, sinks=[jl.HDF5Writer(path)])
        return (time.perf_counter() - t) / n

    cast = StopVote.cast

    def run_without_votes(n):  # the same run, its votes left out (what they cost it, per chunk)
        StopVote.cast = lambda self, s, n_chunk, signum: (s, None)
        try:
            return run(n)
        finally:
            StopVote.cast = cast

    variants = {"vote, read one chunk later": one_behind, "vote, read at once": at_once, "jl.run": run,
                "jl.run without votes": run_without_votes}
    times = {name: [] for name in variants}
    for name, fn in variants.items():
        fn(10)  # warm-up: compiled, connected
    for _ in range(7):  # interleaved: machine load hits every variant alike
        for name, fn in variants.items():
            times[name].append(fn(chunks))
    out = {name: statistics.median(ts) * 1e6 for name, ts in times.items()}
    print(json.dumps({"process": process, "us_per_chunk": out}), flush=True)
    jax.distributed.shutdown()
""")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chunks", type=int, default=100)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="--xla_force_host_platform_device_count=2")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "examples"), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory() as d:
        procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(i), str(port), str(args.chunks),
                                   str(Path(d) / "t.h5")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for i in range(2)]
        for p in procs:
            out, err = p.communicate(timeout=600)
            if p.returncode:
                sys.exit(err[-3000:])
            got = json.JSONDecoder().raw_decode(out, out.rfind('{"process"'))[0]  # gloo writes to stdout too
            cells = ", ".join(f"{k} {v:.0f} us" for k, v in got["us_per_chunk"].items())
            print(f"process {got['process']}: per chunk: {cells}")


if __name__ == "__main__":
    main()
