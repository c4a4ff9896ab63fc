"""Child probe for a compiled extension (bitsandbytes or flash-attn); prints `LORADOCTOR_PROBE {json}`.

Standalone (no loradoctor imports). Usage: python -c "<this source>" bitsandbytes|flash_attn
"""
import json
import os
import sys
import traceback

out = {"stage": "start"}


def emit(stage):
    out["stage"] = stage
    sys.stdout.write("LORADOCTOR_PROBE " + json.dumps(out, default=str) + "\n")
    sys.stdout.flush()


def probe_bnb():
    import bitsandbytes

    out["version"] = getattr(bitsandbytes, "__version__", None)
    emit("imported")
    try:
        from bitsandbytes import cextension

        lib = getattr(cextension, "lib", None)
        kind = type(lib).__name__ if lib is not None else "None"
        out["library"] = kind
        compiled = getattr(lib, "compiled_with_cuda", None)
        if compiled is None:
            # 0.44+: a mock library object stands in when the native one failed to load.
            compiled = lib is not None and "mock" not in kind.lower() and "error" not in kind.lower()
            name = str(getattr(getattr(lib, "_lib", None), "_name", "") or "")
            if name:
                out["detail"] = name
                compiled = compiled and "cpu" not in name.rsplit("/", 1)[-1]
        out["cuda"] = bool(compiled)
    except Exception as exc:
        out["cuda"] = False
        out["detail"] = f"{type(exc).__name__}: {exc}"


def probe_flash_attn():
    import flash_attn

    out["version"] = getattr(flash_attn, "__version__", None)
    emit("imported")
    import flash_attn_2_cuda  # noqa: F401  the compiled extension: ABI mismatches fail here

    out["extension"] = True


def main():
    import importlib.util

    name = sys.argv[1]
    if importlib.util.find_spec(name) is None:
        out["installed"] = False
        emit("missing")
        return 0
    out["installed"] = True
    emit("found")
    try:
        probe_bnb() if name == "bitsandbytes" else probe_flash_attn()
    except BaseException as exc:
        out["import_error"] = f"{type(exc).__name__}: {exc}"
        traceback.print_exc()
        emit("import_failed")
        return 1
    emit("done")
    return 0


code = main()
# Skip interpreter teardown: unloading torch takes seconds and we have printed everything we need.
sys.stdout.flush()
sys.stderr.flush()
os._exit(code)
