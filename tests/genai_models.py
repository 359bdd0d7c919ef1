"""Tiny LLMs as onnxruntime-genai's model builder writes them: a transformers checkpoint with random weights (fixed
seed, no download) and a WordLevel tokenizer, then `python -m onnxruntime_genai.models.builder`. Needs the test
extras (torch, transformers, onnxruntime-genai); the tests that use it skip without them, naming what is missing.
torch, transformers and genai run in child processes only: the test process (which forks every other test's
builds) never loads them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

VOCAB = 512
SHAPE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 128, "bos_token_id": 1,
         "eos_token_id": 2}


def checkpoint(kind: str, folder: Path) -> Path:
    """A `save_pretrained` folder: LLaMA, or Qwen2 with tied embeddings (whose int4 export gathers its embeddings
    with GatherBlockQuantized)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    model = (LlamaForCausalLM(LlamaConfig(**SHAPE)) if kind == "llama"
             else Qwen2ForCausalLM(Qwen2Config(**SHAPE, tie_word_embeddings=True)))
    model.save_pretrained(folder)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)
    return folder


def _in_child(code: str) -> str:
    here = Path(__file__).resolve().parent
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join([str(here), str(here.parent / "rules")])})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return done.stdout


def built(kind: str, precision: str, folder: Path) -> Path:
    """The builder's output folder (genai_config.json, model.onnx, model.onnx.data, tokenizer files)."""
    source = folder / f"{kind}-checkpoint"
    _in_child(f"import genai_models; genai_models.checkpoint({kind!r}, __import__('pathlib').Path({str(source)!r}))")
    out = folder / f"{kind}-{precision}"
    done = subprocess.run([sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", str(source), "-o",
                           str(out), "-p", precision, "-e", "cpu"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return out


def genai_tokens(folder: Path, prompt: list[int], count: int) -> list[int]:
    """onnxruntime-genai's own greedy decoding of `folder` (in a child process)."""
    code = ("import json, pathlib, onnxruntime_genai as og; "
            "from epbuild.steps.validation.pipeline_checks import genai_greedy; "
            f"print(json.dumps(genai_greedy(og, pathlib.Path({str(folder)!r}), {prompt!r}, {count})))")
    return json.loads(_in_child(code).strip().splitlines()[-1])


def genai_folder_check(folder: Path, prompt: list[int], tokens: list[int]) -> dict:
    """`pipeline_checks.genai_folder_run` on an OpenVINO group's folder (in a child process, the vendor-id shim
    prepared where the host needs it)."""
    code = ("import json, pathlib, tempfile; from epbuild.steps import vendor_shim; "
            "from epbuild.manifest.eps import lookup; "
            "from epbuild.steps.validation.pipeline_checks import genai_folder_run; "
            "vendor_shim.prepare(pathlib.Path(tempfile.mkdtemp())); "
            f"print(json.dumps(genai_folder_run(lookup('openvino'), pathlib.Path({str(folder)!r}), "
            f"{{'prompt': {prompt!r}, 'tokens': {tokens!r}}}, None)))")
    return json.loads(_in_child(code).strip().splitlines()[-1])
