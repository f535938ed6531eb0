"""The safetensors writer shared by the PyTorch fixture scripts, tests/*/fixtures/make_reference.py.

Written with struct + json (no safetensors package) in the layout the reference writer uses:
an 8-byte little-endian header length, a compact JSON header padded with spaces to a multiple
of 8 bytes, then the tensors' bytes in name order. The fixture scripts put this folder on
sys.path from their own __file__, so they run from any working directory.
"""
import json
import struct

import torch

# torch dtype -> safetensors dtype code
DTYPES = {
    torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32",
    torch.bool: "BOOL", torch.float16: "F16", torch.bfloat16: "BF16",
}


def tensor_bytes(t):
    """The raw little-endian bytes of a contiguous CPU tensor."""
    if t.dtype == torch.bfloat16:  # numpy has no bfloat16: reinterpret the bits
        t = t.view(torch.int16)
    a = t.numpy()
    return a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()


def fixture_metadata(generator, metadata=None):
    """The header's __metadata__: `metadata` (in its order), then the generating script's path
    from the repository root and the torch version that computed the values."""
    return dict(metadata or {}, generator=generator, torch=torch.__version__)


def write_safetensors(path, tensors, metadata):
    """Writes tensors (name -> torch.Tensor) and metadata (str -> str, kept in its order) to
    path. Tensors are stored in sorted name order with contiguous data offsets."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        t = tensors[name].detach().cpu().contiguous()
        data = tensor_bytes(t)
        header[name] = {"dtype": DTYPES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
