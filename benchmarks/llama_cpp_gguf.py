"""GGUF files of a Hugging Face folder, for the llama.cpp rows of the benchmarks.

    python benchmarks/llama_cpp_gguf.py FOLDER OUT_DIR     # prints {type: path} as JSON

llama.cpp's own tools do the work: its converter (convert_hf_to_gguf.py with its gguf-py,
from llama-cpp-python's source, unpacked into .venv/llama-cpp-src by ``make bench``) writes
the float32 file, and llama.cpp's quantizer (``llama_model_quantize`` through
llama-cpp-python, its default recipe) makes q8_0 and q4_0 from it. Nothing is installed by
``make test``: without llama-cpp-python or the converter, ``missing()`` says what to run.

Two settings are ours, about the tokenizer: the folders here carry tiny-code's tokenizer.json
(byte-level BPE with GPT-2's pre-tokenizer regex), so the converter is told so: a Llama
folder's vocabulary is read as GPT-2-style BPE (the converter would first try
sentencepiece, which is not installed), and the pre-tokenizer is named "gpt-2" (the
converter recognises it by hashing how it splits a test string, and knows only published
models' hashes). The benchmarks feed token ids; the tokenizer only has to load.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ENV = "MLXGRAPH_LLAMA_CPP_SRC"  # where convert_hf_to_gguf.py, conversion/, gguf-py/ are
# llama.cpp's ftype numbers (llama.h): float32 is the converter's own output.
FTYPES = {"q8_0": 7, "q4_0": 2}


def source_dir() -> Path:
    """The unpacked llama.cpp converter (``make bench`` puts it in .venv/llama-cpp-src)."""
    return Path(os.environ.get(SOURCE_ENV) or ROOT / ".venv" / "llama-cpp-src")


def missing() -> str:
    """Why the llama.cpp rows cannot run here ("" when they can)."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError:
        return "llama-cpp-python is not installed (make bench installs it)"
    if not (source_dir() / "convert_hf_to_gguf.py").is_file():
        return f"llama.cpp's converter is not in {source_dir()} (make bench unpacks it)"
    return ""


def _convert_child(folder: str, out: str) -> None:
    """Run llama.cpp's converter on ``folder`` (float32 GGUF at ``out``) in this process."""
    src = source_dir()
    sys.path[:0] = [str(src), str(src / "gguf-py")]
    import convert_hf_to_gguf
    from conversion.base import TextModel
    from conversion.llama import LlamaModel

    # The tokenizer's kind, named rather than guessed: see the module docstring.
    LlamaModel.set_vocab = TextModel._set_vocab_gpt2
    TextModel.get_vocab_base_pre = lambda self, tokenizer: "gpt-2"
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", "f32", "--outfile", out]
    convert_hf_to_gguf.main()


def _quantize_child(source: str, out: str, kind: str) -> None:
    """llama.cpp's quantizer with its default parameters (as llama-quantize runs it)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = FTYPES[kind]
    params.nthread = min(2, os.cpu_count() or 1)
    if llama_cpp.llama_model_quantize(source.encode(), out.encode(), params) != 0:
        raise SystemExit(f"llama_model_quantize failed for {kind}")


def _run(args: list, what: str) -> None:
    done = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-2000:] + done.stderr[-4000:])
        raise SystemExit(f"llama_cpp_gguf: {what} failed (exit {done.returncode})")


def convert(folder: Path, out_dir: Path) -> dict:
    """{"f32": path, "q8_0": path, "q4_0": path}: ``folder`` as GGUF files in ``out_dir``
    (each made in a child process; files already there are reused)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {kind: out_dir / f"{folder.name}-{kind}.gguf" for kind in ("f32", *FTYPES)}
    if not paths["f32"].is_file():
        _run(["--convert", str(folder), str(paths["f32"])], f"converting {folder}")
    for kind in FTYPES:
        if not paths[kind].is_file():
            _run(["--quantize", str(paths["f32"]), str(paths[kind]), kind], f"{kind} of {folder}")
    return paths


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--convert"]:
        _convert_child(*args[1:])
    elif args[:1] == ["--quantize"]:
        _quantize_child(*args[1:])
    else:
        if reason := missing():
            raise SystemExit(reason)
        paths = convert(Path(args[0]), Path(args[1]))
        print(json.dumps({k: str(v) for k, v in paths.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
