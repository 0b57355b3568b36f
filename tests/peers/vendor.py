"""Re-create the vendored peer tests from the peers' published source, with only their imports rewritten.

    python -m tests.peers.vendor pytorch_accelerated SDIST.tar.gz   # pytorch-accelerated's PyPI sdist
    python -m tests.peers.vendor pytorch_accelerated_examples SDIST.tar.gz   # its examples/core
    python -m tests.peers.vendor pytorch_accelerated_vision CHECKOUT # examples/vision, a v0.1.61 checkout
    python -m tests.peers.vendor colossalai_examples CHECKOUT        # ColossalAI-Examples' features/
    python -m tests.peers.vendor colossalai_examples_image CHECKOUT  # and its image/
    python -m tests.peers.vendor detectron2 CHECKOUT                 # a detectron2 checkout
    python -m tests.peers.vendor t9k_examples CHECKOUT --out DIR     # t9k/tutorial-examples' em/ (not vendored)

The files under ``tests/peers/<peer>/`` are exactly this script's output (``--check`` compares):
the peers' tests with their imports rewritten, and for detectron2's ``test_engine.py`` the
parts that need detectron2's config system taken out (:data:`CONFIG_SYSTEM`); ``README.md``
beside them says which version they come from and under which license.
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).parent
TARGETS = {
    "pytorch_accelerated_examples": HERE.parent / "seeds" / "programs" / "pytorch_accelerated",
    "pytorch_accelerated_vision": HERE.parent / "seeds" / "programs" / "pytorch_accelerated" / "vision",
    "colossalai_examples": HERE.parent / "seeds" / "programs" / "colossalai",
    "colossalai_examples_image": HERE.parent / "seeds" / "programs" / "colossalai" / "image",
}
"""Where a peer's files go, when not ``tests/peers/<peer>``."""

PEERS = {
    # peer: (where its tests are in the source, the files, the rewrite of its import name)
    "pytorch_accelerated": (
        "test",
        ["test_finetuning.py", "test_loss_tracking.py", "test_placeholders.py", "test_run_history.py",
         "test_trainer.py", "test_utils.py", "scheduler/test_cosine_scheduler.py",
         "scheduler/test_scheduler_base.py", "scheduler/test_wsd_scheduler.py"],
        [(r"\bpytorch_accelerated\b", "ember.compat.pytorch_accelerated"),
         (r"^from test\.", "from tests.peers.pytorch_accelerated.")],
    ),
    "pytorch_accelerated_examples": (
        "examples/core",
        ["train_mnist.py", "custom_callback_event.py", "train_with_metrics_in_callback.py",
         "train_with_metrics_in_loop.py"],
        [(r"\bpytorch_accelerated\b", "ember.compat.pytorch_accelerated"),
         (r"\btorchvision\b", "tests.seeds.standins.torchvision")],
    ),
    "pytorch_accelerated_vision": (
        "examples/vision",
        ["transfer_learning/pytorch_tutorial_finetune.py", "transfer_learning/progressive_resizing.py",
         "transfer_learning/pets_finetune.py"],
        [(r"\bpytorch_accelerated\b", "ember.compat.pytorch_accelerated"),
         (r"\btorchvision\b", "tests.seeds.standins.torchvision"),
         (r"^from timm\b", "from tests.seeds.standins.timm"),
         (r"^from func_to_script\b", "from tests.seeds.standins.func_to_script")],
    ),
    "colossalai_examples": (
        "features",
        ["gradient_accumulation/train.py", "gradient_accumulation/config.py", "gradient_clipping/train.py",
         "gradient_clipping/config.py", "amp/train.py", "amp/config/config_fp32.py", "amp/config/config_AMP_torch.py",
         "amp/config/config_AMP_naive.py", "tensor_parallel/run.py", "tensor_parallel/configs/tp_1d.py",
         "tensor_parallel/configs/tp_2d.py", "tensor_parallel/configs/tp_2p5d.py", "tensor_parallel/configs/tp_3d.py",
         "pipeline_parallel/resnet.py"],
        [(r"^import colossalai$", "import ember.compat.colossalai as colossalai"),
         (r"^import colossalai\.", "import ember.compat.colossalai."),
         (r"^from colossalai\b", "from ember.compat.colossalai"),
         (r"\btorchvision\b", "tests.seeds.standins.torchvision"),
         (r"\btitans\b", "tests.seeds.standins.titans"),
         (r"^from timm\b", "from tests.seeds.standins.timm")],
    ),
    "colossalai_examples_image": (
        "image",
        ["vision_transformer/data_parallel/train_with_cifar10.py", "vision_transformer/data_parallel/config.py"],
        [],  # colossalai_examples' rewrite
    ),
    "t9k_examples": (
        "em",
        ["single-worker-training/torch_mnist_single_em.py", "data-parallel-training/torch_mnist_trainingjob_em.py"],
        [(r"^from t9k import em$", "from ember.compat.t9k import em"),
         (r"\btorchvision\b", "tests.seeds.standins.torchvision"),
         (r"^from torch\.utils\.tensorboard import", "from tests.seeds.standins.tensorboard import")],
    ),
    "detectron2": (
        "tests",
        ["test_events.py", "test_engine.py"],
        [(r"\bdetectron2\b", "ember.compat.detectron2"),
         (r"\bfvcore\.common\.checkpoint\b", "ember.compat.detectron2.checkpoint")],
    ),
}  # fmt: skip

CONFIG_SYSTEM_PEERS = ("detectron2",)

UNLICENSED = ("t9k_examples",)
"""Peers whose repository carries no license: their programs are written to ``--out`` only, never vendored."""

CONFIG_SYSTEM = {
    # detectron2's test_engine.py: what needs detectron2's config system (yacs configs, the model
    # zoo, registries, DefaultTrainer), which ember does not provide, is taken out whole; the rest
    # of the file is as detectron2 wrote it.
    "test_engine.py": {
        "lines": ["from detectron2 import model_zoo\n", "from detectron2.config import configurable, get_cfg\n",
                  "from detectron2.modeling.meta_arch import META_ARCH_REGISTRY\n",
                  "@META_ARCH_REGISTRY.register()\n", "    @configurable\n"],
        "replace": [("from detectron2.engine import DefaultTrainer, SimpleTrainer, default_setup, hooks",
                     "from detectron2.engine import SimpleTrainer, default_setup, hooks")],
        "methods": ["test_default_trainer", "test_setup_config"],
    },
}  # fmt: skip
"""Per file: whole lines, replacements and test methods taken out before the import rewrite."""


def without_config_system(name: str, text: str) -> str:
    """``text`` without :data:`CONFIG_SYSTEM`'s parts for file ``name`` (each must be found)."""
    edits = CONFIG_SYSTEM.get(name)
    if edits is None:
        return text
    for line in edits["lines"]:
        assert line in text, f"{name}: {line!r} not found"
        text = text.replace(line, "", 1)
    for old, new in edits["replace"]:
        assert old in text, f"{name}: {old!r} not found"
        text = text.replace(old, new)
    for method in edits["methods"]:
        start = text.index(f"    def {method}(")
        nxt = re.search(r"\n    (def |@)", text[start + 1 :])
        end = start + 1 + nxt.start() + 1 if nxt else len(text)
        text = text[:start] + text[end:]
    return text


HEADER = "# Vendored from {peer} (see README.md), rewritten by tests/peers/vendor.py: {what} only.\n"


def rewrite(peer: str, text: str) -> str:
    """``text`` with the peer's import names replaced by ember's compat packages."""
    for pattern, replacement in PEERS[peer][2] or PEERS[peer.rsplit("_", 1)[0]][2]:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    what = "its imports (and what needs detectron2's config system)" if peer in CONFIG_SYSTEM_PEERS else "its imports"
    return HEADER.format(peer=peer, what=what) + text


def read_sources(peer: str, source: Path) -> dict[str, str]:
    """The peer's test files, by their path under its test folder."""
    folder, files, _ = PEERS[peer]
    if source.is_dir():
        return {f: (source / folder / f).read_text() for f in files}
    with tarfile.open(source) as tar:
        members = {m.name.split("/", 1)[1]: m for m in tar.getmembers() if "/" in m.name}
        out = {}
        for f in files:
            handle = tar.extractfile(members[f"{folder}/{f}"])
            assert handle is not None
            out[f] = handle.read().decode()
        return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("peer", choices=sorted(PEERS))
    parser.add_argument("source", type=Path, help="the sdist (.tar.gz) or a checkout")
    parser.add_argument("--check", action="store_true", help="compare with the vendored files, write nothing")
    parser.add_argument("--out", type=Path, help="write the files here instead of into tests/")
    args = parser.parse_args(argv)
    if args.peer in UNLICENSED and args.out is None:
        parser.error(f"{args.peer}'s repository has no license: its programs may not be vendored; give --out DIR")
    target = args.out or TARGETS.get(args.peer, HERE / args.peer)
    differ = []
    for name, text in read_sources(args.peer, args.source).items():
        path = target / name
        new = rewrite(args.peer, without_config_system(name, text))
        if args.check:
            if not path.is_file() or path.read_text() != new:
                differ.append(name)
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(new)
        init = path.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
    if differ:
        print(f"differ from the source: {', '.join(differ)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
