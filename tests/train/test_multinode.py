"""Training on two machines, as torchrun starts it: two agents (`--nnodes 2`, one process each)
meet through a c10d rendezvous on 127.0.0.1 and train over gloo on CPU. They end with the
weights of one process that accumulates the same batches (update_freq 2), and a run
directory that is not shared by every node is refused before anything is trained."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import REPO
from helpers import corpora_config, make_config, quiet, weights

STEPS = 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def two_nodes(cfgs: tuple[Path, Path], *args: str) -> list[subprocess.CompletedProcess]:
    """Start one torchrun agent per "node" (each with its own config), as on two machines ->
    their finished processes."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    endpoint = f"127.0.0.1:{free_port()}"
    agents = []
    for cfg in cfgs:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
               "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "two-nodes",
               "--rdzv-conf", "join_timeout=120", "--local-addr", "127.0.0.1",
               "-m", "seq2seq_cli", "train", "--config", str(cfg), "--no-progress",
               "--set", "train.threads=1", "--set", "train.device=cpu", "--set", "model.dropout=0.0", *args]
        agents.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    done = []
    try:
        for agent in agents:
            out, err = agent.communicate(timeout=300)
            done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.communicate()
    return done


@pytest.mark.parametrize("data", ["one corpus", "weighted corpora"])
def test_two_nodes_end_with_the_weights_of_one_process_accumulating_their_batches(tmp_path, data):
    """With one corpus, and with three weighted corpora (weights 2, 0.5 and 1, two of them
    tagged) whose epochs are drawn from (seed, epoch)."""
    common = dict(max_steps=STEPS, log_every=1, valid_every=STEPS, clip_norm=1.0)
    config = make_config if data == "one corpus" else corpora_config
    single = quiet(config(tmp_path, "single", update_freq=2, **common), False, "model.dropout=0.0")

    cfg = config(tmp_path, "nodes", update_freq=1, **common)
    agents = two_nodes((cfg, cfg))
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    assert any("2 processes (cpu)" in a.stderr for a in agents)

    if data == "weighted corpora":
        record = json.loads((tmp_path / "nodes" / "metrics.jsonl").read_text().splitlines()[0])
        assert [c["weight"] for c in record["train_corpora"]] == [2, 0.5, 1]
    one, two = weights(single), weights(tmp_path / "nodes")
    assert one.keys() == two.keys()
    for name in one:
        if name.endswith("w_k.bias"):
            # a key bias adds the same score to every key of a query, which softmax ignores: its
            # true gradient is zero, and Adam turns the rounding noise left in it into steps
            # of up to lr, different for every order of summation
            assert two[name].abs().max() <= STEPS * 3e-3 and one[name].abs().max() <= STEPS * 3e-3
            continue
        torch.testing.assert_close(two[name], one[name], rtol=1e-5, atol=1e-6, msg=name)


def test_a_run_directory_the_nodes_do_not_share_is_refused_before_anything_is_trained(tmp_path):
    """Each node writing its own run directory (a node-local disk) is told in one line."""
    common = dict(max_steps=STEPS, valid_every=STEPS)
    agents = two_nodes((make_config(tmp_path, "node-a", **common), make_config(tmp_path, "node-b", **common)))
    for agent in agents:  # (torchrun's agent adds its own report of the failed process)
        assert agent.returncode != 0
        assert str(REPO / "seq2seq_cli") not in agent.stderr, agent.stderr  # no traceback of the trainer
        errors = [line for line in agent.stderr.splitlines() if line.startswith("error:")]
        assert len(errors) == 1, agent.stderr[-2000:]
        assert "run directory is not shared by all training processes: process 1 on " in errors[0], errors
        assert "put run_dir on a filesystem every machine mounts at the same path" in errors[0]
    for run in ("node-a", "node-b"):
        assert not (tmp_path / run / "checkpoints").exists() and not (tmp_path / run / "cache").exists()


def test_each_node_reading_its_own_copy_of_the_corpus_uses_the_encoding_rank_0_cached(tmp_path):
    """A corpus copied to every machine (other paths, other times) is encoded once, by rank 0,
    into the shared run directory; the other processes read that cache, never encode their
    copy over it, so the next start of the run finds the cache rank 0 made."""
    import shutil

    import yaml

    cfgs = []
    for node, stamp in (("a", 1_600_000_000), ("b", 1_700_000_000)):
        copy = tmp_path / f"data-{node}"
        copy.mkdir()
        for lang in ("es", "en"):
            shutil.copyfile(REPO / "data" / "bible-es-en" / f"valid.{lang}", copy / f"valid.{lang}")
            os.utime(copy / f"valid.{lang}", (stamp, stamp))
        raw = yaml.safe_load(make_config(tmp_path, "shared", max_steps=2, valid_every=2).read_text())
        raw["data"]["train"] = raw["data"]["valid"] = str(copy / "valid")
        cfgs.append(tmp_path / f"node-{node}.yaml")
        cfgs[-1].write_text(yaml.safe_dump(raw), encoding="utf-8")
    agents = two_nodes((cfgs[0], cfgs[1]))
    for agent in agents:
        assert agent.returncode == 0, agent.stderr[-3000:]
    main = next(i for i, a in enumerate(agents) if "2 processes (cpu)" in a.stderr)  # rank 0 logs

    from seq2seq_cli.config_load import load_config
    from seq2seq_cli.train.loop import train

    lines: list[str] = []
    train(load_config(cfgs[main], ["train.max_steps=3"]), resume=True, progress=False, log=lines.append)
    assert sum("reusing encoded" in line for line in lines) == 2, lines  # train and valid


def test_a_run_directory_on_a_filesystem_without_file_locks_is_one_line(tmp_path, monkeypatch):
    """A shared filesystem mounted without lock support (Lustre without -o flock, NFS without
    its lock service) makes flock fail with ENOSYS or ENOLCK: said in one line, nothing written."""
    import errno
    import fcntl

    from typer.testing import CliRunner

    from seq2seq_cli.cli import app

    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    cfg = make_config(tmp_path, "run", max_steps=1)
    result = CliRunner().invoke(app, ["train", "--config", str(cfg), "--no-progress"])
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.output, result.output
    assert lines[0] == (f"error: {tmp_path / 'run'}: the run directory cannot be locked (No locks available): its "
                        "filesystem does not support file locks (Lustre: mount it with -o flock; NFS: run its lock "
                        "service); use a run_dir on one that does")
    assert not (tmp_path / "run" / "checkpoints").exists() and not (tmp_path / "run" / "cache").exists()


def test_a_run_locked_from_another_machine_names_that_machine(tmp_path):
    """On a shared run directory the lock's holder may run elsewhere: its pid alone would
    point at the wrong process, so the message names its machine too."""
    import socket
    import time

    from typer.testing import CliRunner

    from seq2seq_cli.cli import app

    run = tmp_path / "run"
    run.mkdir()
    code = ("import fcntl, json, sys, time; f = open(sys.argv[1], 'a+'); fcntl.flock(f, fcntl.LOCK_EX);"
            "f.write(json.dumps({'pid': 4242, 'host': 'node2', 'command': 'seq2seq train', 'since': 0}) + '\\n');"
            "f.flush(); print('locked', flush=True); time.sleep(120)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(run / ".lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        result = CliRunner().invoke(app, ["train", "--config", str(make_config(tmp_path, "run")), "--no-progress"])
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == 1
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(0))
    assert result.stderr.strip() == (f"error: {run}: run directory is in use by pid 4242 on node2 (seq2seq train, "
                                     f"since {since}); wait for it to finish, or use another run_dir")
    assert socket.gethostname() != "node2"
