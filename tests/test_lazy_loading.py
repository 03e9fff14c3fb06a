"""Sharded checkpoints (``model.safetensors.index.json``), read lazily one tensor at a time.

A sharded copy of a checkpoint gives the same logits as the single file; a missing or truncated
shard, or an index that puts a tensor in the wrong shard, fails naming the file. Peak host memory
while loading a checkpoint of a few hundred MB is measured in a subprocess from the process's own
high-water mark (``VmHWM``, reset through ``/proc/self/clear_refs`` just before loading, after a
tiny checkpoint has paid torch's one-off costs of first use): beyond
the model's own weights it stays within a small multiple of the largest tensor, not the
checkpoint (reading every shard into memory first, as the loader once did, costs all of it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from replica.model import LayerBuffers, build_tiny, load_model, save_checkpoint
from replica.model.checkpoint_files import INDEX, CheckpointError
from replica.model.config import ModelConfig
from replica.model.hybrid import HybridModel
from tests.support.hf_peer import tiny_hf_bamba
from tests.support.serve_process import REPO

# Largest tensor: a mamba in_proj of 1024 x 4160 (17 MB in float32); about 90 M parameters.
BIG = ModelConfig(
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=2048,
    num_hidden_layers=6,
    num_attention_heads=8,
    num_key_value_heads=4,
    attn_layer_indices=(2, 5),
    mamba_n_heads=32,
    mamba_d_head=64,
)


def shard(path: str, shards: int) -> dict[str, str]:
    """Rewrite ``path``'s ``model.safetensors`` as ``shards`` files and an index (as
    ``save_pretrained`` does with ``max_shard_size``); returns the index's weight map."""
    single = os.path.join(path, "model.safetensors")
    tensors = load_file(single)
    os.remove(single)
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {n: tensors[n] for n in names[i::shards]}
        save_file(part, os.path.join(path, file), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(part, file))
    with open(os.path.join(path, INDEX), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    return weight_map


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> tuple[str, str]:
    single, sharded = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("sharded")
    tiny_hf_bamba(seed=2).save_pretrained(str(single))
    tiny_hf_bamba(seed=2).save_pretrained(str(sharded))
    shard(str(sharded), 3)
    return str(single), str(sharded)


def _logits(path: str) -> torch.Tensor:
    cfg, model, _ = load_model(path)
    ids = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(0))
    buffers = LayerBuffers.allocate(cfg, mamba_slots=2, kv_token_slots=64)
    return model.forward_extend(ids, 0, 1, torch.arange(40), buffers, all_logits=True)


def test_sharded_checkpoint_gives_the_logits_of_the_single_file(checkpoints):
    single, sharded = checkpoints
    assert len([n for n in os.listdir(sharded) if n.endswith(".safetensors")]) == 3
    assert torch.equal(_logits(sharded), _logits(single))


def test_broken_shards_are_named(checkpoints, tmp_path):
    _, sharded = checkpoints
    weight_map = json.load(open(os.path.join(sharded, INDEX)))["weight_map"]
    first = sorted(set(weight_map.values()))[0]
    for case in ("missing", "truncated", "misplaced"):
        path = tmp_path / case
        os.makedirs(path)
        for name in os.listdir(sharded):
            if name != INDEX:
                os.link(os.path.join(sharded, name), path / name)
        index = {"weight_map": dict(weight_map)}
        if case == "missing":
            os.remove(path / first)
        elif case == "truncated":
            data = (path / first).read_bytes()
            os.remove(path / first)
            (path / first).write_bytes(data[: len(data) // 2])
        else:
            moved = sorted(n for n, f in weight_map.items() if f == first)[0]
            index["weight_map"][moved] = sorted(set(weight_map.values()))[1]
        (path / INDEX).write_text(json.dumps(index))
        with pytest.raises(CheckpointError) as err:
            load_model(str(path))
        assert str(path) in str(err.value), (case, err.value)
        assert first in str(err.value) or case == "misplaced", (case, err.value)


_MEASURE = """
import json, sys, torch
from replica.model import load_model

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key):
            return int(line.split()[1]) * 1024

load_model(sys.argv[2])  # first use (torch's thread pools, lazy imports): ~70 MB, any size
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the high-water mark starts again from the current resident set
before = status("VmRSS")
_, model, _ = load_model(sys.argv[1])
weights = sum(p.numel() * p.element_size() for p in model.parameters())
print(json.dumps({"before": before, "peak": status("VmHWM"), "weights": weights}))
"""


def test_peak_host_memory_while_loading_is_about_one_tensor(tmp_path):
    if not os.access("/proc/self/clear_refs", os.W_OK):
        pytest.skip("this kernel does not let a process reset its VmHWM")
    torch.manual_seed(0)
    with torch.no_grad():
        model = HybridModel(BIG)
    save_checkpoint(BIG, model, str(tmp_path / "big"))
    del model
    cfg, tiny, _ = build_tiny("tiny-bamba")
    save_checkpoint(cfg, tiny, str(tmp_path / "tiny"))
    tmp_path = tmp_path / "big"
    shard(str(tmp_path), 4)
    files = [tmp_path / n for n in os.listdir(tmp_path) if n.endswith(".safetensors")]
    on_disk = sum(f.stat().st_size for f in files)
    largest = max(t.numel() for f in files for t in load_file(f).values()) * 4  # float32
    out = subprocess.run(
        [sys.executable, "-c", _MEASURE, str(tmp_path), str(tmp_path.parent / "tiny")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    m = json.loads(out.stdout.strip().splitlines()[-1])
    extra = m["peak"] - m["before"] - m["weights"]  # host memory beyond the loaded weights
    mb = 2**20
    print(f"checkpoint {on_disk / mb:.0f} MB, largest tensor {largest / mb:.0f} MB (float32), "
          f"weights {m['weights'] / mb:.0f} MB, peak beyond them {extra / mb:.0f} MB")  # fmt: skip
    assert on_disk > 250 * mb and largest * 8 < on_disk
    assert extra < 3 * largest, f"{extra / mb:.0f} MB beyond the weights while loading"
