"""``drive.prepare.sharding``: the stop vote and ``gather``, on 4 host CPU devices in one process (the
vote's program, its verdicts and its spacing; tests/test_checkpoint_processes.py votes across two
processes, one of them SIGTERMed)."""

from __future__ import annotations

from test_sharding import _run_program

BODY = """
    from pytest_jaxlog.drive.prepare import sharding as consensus, sharding as shards
    from pytest_jaxlog.drive.prepare.sharding import StopVote

    x = jax.device_put(np.arange(8, dtype=np.float32), sharded)
    vote = StopVote(shards.replicated_on(x))
    stopped = shards.place(np.full(3, -1, np.int32), NamedSharding(mesh, P()))
    s1, v1 = vote.cast(stopped, 0, 0)
    quiet = vote.read(v1)
    s2, v2 = vote.cast(s1, 1, 15)  # due again: the first vote asked for a vote each chunk until it measured one
    asked = vote.read(v2)
    consensus.VOTE_INTERVAL_S = 1e9  # every process proposes the most chunks between votes
    s3, v3 = vote.cast(s2, 2, 0)
    vote.read(v3)
    skipped = [vote.cast(s3, n, 0)[1] is None for n in range(3, 3 + 5)]
    print(json.dumps({"quiet": quiet, "asked": asked, "stopped": np.asarray(s3).tolist(),
                      "same": s3.sharding == stopped.sharding, "spacing": vote.spacing, "skipped": skipped,
                      "gathered": consensus.gather([4, 5]).tolist()}))
"""


def test_the_vote_names_who_asked_and_agrees_on_its_spacing():
    out = _run_program(BODY, devices=4)
    assert out["quiet"] == {} and out["asked"] == {"0": 15}  # process 0 (all 4 devices here) asked, with SIGTERM
    assert out["stopped"] == [-1, -1, -1] and out["same"]  # handed on unchanged, on the same sharding
    # the spacing agreed by a vote counts from the vote after it (one was due after chunk 3): then none for 1024
    assert out["spacing"] == 1024 and out["skipped"] == [False, True, True, True, True]
    assert out["gathered"] == [[4, 5]]
