"""``CheckpointFiles``: the tensors of a checkpoint directory's safetensors, read one at a time.

Only the headers are read up front (names, shapes, dtypes). ``read`` opens the tensor's shard
with ``safetensors.safe_open`` for that one tensor and closes it again: a shard kept open keeps
every page it has read mapped into the process, so reading a whole checkpoint through one open
file grows the resident set to the checkpoint's size. Opened per tensor, host memory while
loading peaks at about one tensor (on CUDA it goes straight to the device).
"""

from __future__ import annotations

import json
import os

import torch
from safetensors import SafetensorError, safe_open

INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """A checkpoint file is missing, unreadable or inconsistent; the message names it."""


class CheckpointFiles:
    """The tensors of ``path``: ``model.safetensors``, the shards an ``INDEX`` lists, or every
    ``*.safetensors`` there. Raises ``CheckpointError`` on construction for a missing or
    unreadable shard, or an index naming a tensor its shard lacks."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.shard_of: dict[str, str] = {}
        self.shapes: dict[str, tuple[int, ...]] = {}
        index = self._index()
        shards = sorted(set(index.values())) if index is not None else self._listed()
        for shard in shards:
            self._scan(shard)
        for name, shard in (index or {}).items():
            if self.shard_of.get(name) != shard:
                raise CheckpointError(f"{os.path.join(path, INDEX)} puts {name} in {shard}, "
                                      "which does not hold it")  # fmt: skip

    def _index(self) -> dict[str, str] | None:
        file = os.path.join(self.path, INDEX)
        if not os.path.exists(file):
            return None
        try:
            with open(file) as f:
                return dict(json.load(f)["weight_map"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise CheckpointError(f"cannot read the shard index {file}: {exc}") from exc

    def _listed(self) -> list[str]:
        shards = sorted(n for n in os.listdir(self.path) if n.endswith(".safetensors"))
        if not shards:
            raise CheckpointError(f"no *.safetensors files in {self.path}")
        return shards

    def _scan(self, shard: str) -> None:
        file = os.path.join(self.path, shard)
        try:
            with safe_open(file, "pt") as f:
                for name in f.keys():
                    self.shapes[name] = tuple(f.get_slice(name).get_shape())
                    self.shard_of[name] = shard
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"cannot read the checkpoint file {file}: {exc}") from exc

    def read(self, name: str, device: torch.device | str = "cpu") -> torch.Tensor:
        """Tensor ``name`` in its stored dtype, on ``device``."""
        file = os.path.join(self.path, self.shard_of[name])
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        try:
            with safe_open(file, "pt", device=str(device)) as f:
                return f.get_tensor(name)
        except (OSError, SafetensorError) as exc:
            raise CheckpointError(f"cannot read {name} from {file}: {exc}") from exc
