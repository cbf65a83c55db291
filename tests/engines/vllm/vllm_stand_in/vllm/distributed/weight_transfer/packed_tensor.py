"""vLLM's packed NCCL broadcast, as a TCP stream: each tensor as ``torch.save`` bytes after an 8-byte length."""

import io
import struct

import torch


def packed_nccl_broadcast_producer(iterator, group, src, post_iter_func):
    for item in iterator:
        buffer = io.BytesIO()
        torch.save(post_iter_func(item).detach().cpu().contiguous(), buffer)
        payload = buffer.getvalue()
        group.group.socket.sendall(struct.pack("<Q", len(payload)) + payload)


def read_tensor(connection) -> torch.Tensor:
    """The server's side: the next tensor of the stream."""
    (size,) = struct.unpack("<Q", _read(connection, 8))
    return torch.load(io.BytesIO(_read(connection, size)), weights_only=True)


def _read(connection, size: int) -> bytes:
    chunks = []
    while size:
        chunk = connection.recv(min(size, 1 << 20))
        if not chunk:
            raise ConnectionError("the trainer closed the weight stream")
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)
