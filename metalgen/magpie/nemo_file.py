"""Read a NeMo `.nemo` checkpoint without torch.

A `.nemo` is a tar (plain or gzipped) holding `model_config.yaml` (OmegaConf's YAML dump) and
`model_weights.ckpt`, which is `torch.save(state_dict)` in torch's zip format:

    <root>/data.pkl          the pickled state dict; each tensor is a call to
                             torch._utils._rebuild_tensor_v2(storage, offset, size, stride, ...)
                             whose storage is a persistent id ('storage', torch.<T>Storage, key,
                             location, numel)
    <root>/data/<key>        the raw bytes of storage <key> (uncompressed, 64-byte aligned)
    <root>/byteorder         "little" or "big" (absent in old files: little)

`<root>` is whatever name the file was saved under (NeMo's is `model_weights`). The pickle is read
by a restricted unpickler that knows only the globals a state dict needs and refuses every other
one, so a crafted checkpoint cannot run code. Tensors come back as read-only numpy views of the
storage bytes (memory-mapped from the `.nemo` when the tar is not compressed, so a 1.4 GB
checkpoint costs no copy); bfloat16 storages, which numpy lacks, are widened to float32.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import tarfile
import zipfile
from pathlib import Path
from typing import Callable, Dict, Tuple, Union

import numpy as np

from ..errors import MetalgenError

CONFIG_NAME = "model_config.yaml"
WEIGHTS_NAME = "model_weights.ckpt"

# torch.<Name>Storage -> numpy dtype. These classes only tag a storage's element type in the
# persistent id; nothing of torch is ever called.
_STORAGE_DTYPES = {
    "FloatStorage": np.float32,
    "DoubleStorage": np.float64,
    "HalfStorage": np.float16,
    "BFloat16Storage": np.uint16,  # widened to float32 after reading (see _storage_array)
    "LongStorage": np.int64,
    "IntStorage": np.int32,
    "ShortStorage": np.int16,
    "CharStorage": np.int8,
    "ByteStorage": np.uint8,
    "BoolStorage": np.bool_,
    "ComplexFloatStorage": np.complex64,
    "ComplexDoubleStorage": np.complex128,
}

# The first bytes of the compressed tar flavours tarfile can open; their members cannot be
# memory-mapped, so they are read into memory instead.
_COMPRESSED_MAGIC = (b"\x1f\x8b", b"BZh", b"\xfd7zXZ")


class _ArrayFile(io.RawIOBase):
    """A seekable read-only file over a uint8 array, for zipfile: io.BytesIO would copy it."""

    def __init__(self, data: np.ndarray):
        super().__init__()
        self.data = data
        self.pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.data.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        chunk = self.data[self.pos : self.pos + len(buffer)]
        n = chunk.size
        memoryview(buffer).cast("B")[:n] = chunk.tobytes()
        self.pos += n
        return n


class _StorageType:
    """What `torch.FloatStorage` & co. unpickle to: just the element type's name."""

    def __init__(self, name: str):
        self.name = name


class _Storage:
    """One storage's elements as a 1-D numpy array."""

    def __init__(self, array: np.ndarray, key: str):
        self.array = array
        self.key = key


def read_nemo(path: Union[str, Path]) -> Tuple[dict, Dict[str, np.ndarray]]:
    """(config, weights) of a `.nemo` file.

    `config` is `model_config.yaml` as plain dicts, lists and scalars. `weights` maps each
    state-dict key to a read-only numpy array with the tensor's dtype, shape and strides (views of
    the storages: tensors that shared a storage in torch share memory here). Entries of the state
    dict that are not tensors are left out. Every problem (not a tar, no config, no weights, a
    pickle global outside the state-dict vocabulary) is a one-line MetalgenError naming the file.
    """
    path = Path(path)
    if not path.is_file():
        raise MetalgenError(f"no .nemo file at {path}")
    with open(path, "rb") as f:
        compressed = f.read(6).startswith(_COMPRESSED_MAGIC)
    try:
        tar = tarfile.open(path, "r:*")
    except (tarfile.TarError, OSError) as e:
        raise MetalgenError(f"{path} is not a .nemo file (not a tar archive: {e})")
    with tar:
        members = {}
        for m in tar.getmembers():
            name = m.name[2:] if m.name.startswith("./") else m.name
            members[name] = m
        config = _read_config(path, tar, members.get(CONFIG_NAME))
        member = members.get(WEIGHTS_NAME)
        if member is None or not member.isfile():
            sharded = any(n.startswith("model_weights/") for n in members)
            raise MetalgenError(
                f"{path} holds no {WEIGHTS_NAME}"
                + (" (it is a sharded/distributed checkpoint, which is not supported)" if sharded else "")
            )
        if member.size == 0:
            raise MetalgenError(f"{WEIGHTS_NAME} in {path} is empty")
        if compressed:
            data = np.frombuffer(tar.extractfile(member).read(), np.uint8)
        else:
            # The member's bytes lie contiguously in the file: map them once and view storages
            # out of that one map.
            data = np.memmap(path, dtype=np.uint8, mode="r", offset=member.offset_data, shape=(member.size,))
        weights = _read_checkpoint(path, data)
    return config, weights


def _read_config(path: Path, tar: tarfile.TarFile, member) -> dict:
    if member is None or not member.isfile():
        raise MetalgenError(f"{path} holds no {CONFIG_NAME}")
    text = tar.extractfile(member).read().decode("utf-8")
    try:
        # PyYAML comes with huggingface_hub (one of metalgen's dependencies); OmegaConf, which
        # NeMo saves with, writes through PyYAML too, so its safe loader reads the file exactly.
        import yaml
    except ImportError:
        raise MetalgenError(f"reading {path} needs PyYAML: pip install pyyaml")
    try:
        config = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MetalgenError(f"{CONFIG_NAME} in {path} is not valid YAML: {e}")
    if not isinstance(config, dict):
        raise MetalgenError(f"{CONFIG_NAME} in {path} is not a mapping")
    return config


def _read_checkpoint(path: Path, data: np.ndarray) -> Dict[str, np.ndarray]:
    """The state dict in torch's zip format, whose bytes are `data` (uint8); storages are views
    of it."""
    where = f"{WEIGHTS_NAME} in {path}"

    def raw(start: int, size: int) -> np.ndarray:
        return data[start : start + size]

    try:
        zf = zipfile.ZipFile(_ArrayFile(data))
    except zipfile.BadZipFile:
        raise MetalgenError(f"{where} is not in torch's zip format (a legacy torch.save file?)")
    with zf:
        infos = {i.filename: i for i in zf.infolist()}
        pickles = [n for n in infos if n.count("/") == 1 and n.endswith("/data.pkl")]
        if len(pickles) != 1:
            raise MetalgenError(f"{where} has no single <root>/data.pkl")
        root = pickles[0][: -len("data.pkl")]
        order = "little"
        if root + "byteorder" in infos:
            order = zf.read(root + "byteorder").decode("ascii").strip()
            if order not in ("little", "big"):
                raise MetalgenError(f"{where} has an unknown byte order '{order}'")

        def storage_bytes(key: str) -> np.ndarray:
            info = infos.get(f"{root}data/{key}")
            if info is None:
                raise MetalgenError(f"{where} lacks the storage data/{key}")
            if info.compress_type != zipfile.ZIP_STORED:
                # torch never compresses storages; read such a file the slow way all the same.
                return np.frombuffer(zf.read(info), np.uint8)
            # The data start after the local header, whose name and extra field lengths can
            # differ from the central directory's copy, so they are read from the header itself.
            header = bytes(raw(info.header_offset, 30))
            if len(header) < 30 or header[:4] != b"PK\x03\x04":
                raise MetalgenError(f"{where} has a broken zip header for data/{key}")
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            return raw(info.header_offset + 30 + name_len + extra_len, info.file_size)

        try:
            unpickler = _StateDictUnpickler(io.BytesIO(zf.read(pickles[0])), where, storage_bytes, order)
            state = unpickler.load()
        except MetalgenError:
            raise
        except Exception as e:  # a truncated or malformed pickle or zip: still one line, naming the file
            raise MetalgenError(f"{where} could not be read: {type(e).__name__}: {e}")
    if not isinstance(state, dict):
        raise MetalgenError(f"{where} does not hold a state dict (got {type(state).__name__})")
    return {str(k): v for k, v in state.items() if isinstance(v, np.ndarray)}


class _StateDictUnpickler(pickle.Unpickler):
    """Unpickles a torch state dict into numpy arrays and nothing else.

    `find_class` is the only way a pickle reaches code, so it answers with our own stand-ins for
    the few names a state dict uses and refuses the rest."""

    def __init__(self, file, where: str, storage_bytes: Callable[[str], np.ndarray], order: str):
        super().__init__(file)
        self.where = where
        self.storage_bytes = storage_bytes
        self.order = order
        self.storages: Dict[str, _Storage] = {}

    def find_class(self, module: str, name: str):
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name == "_rebuild_tensor_v2":
            return self._rebuild_tensor
        if module == "torch._utils" and name == "_rebuild_parameter":
            return _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise MetalgenError(
            f"{self.where} refers to the unsupported pickle global {module}.{name}; refusing to load it"
        )

    def persistent_load(self, pid):
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage" and isinstance(pid[1], _StorageType)):
            raise MetalgenError(f"{self.where} has an unsupported persistent id {pid!r:.80}")
        _, kind, key, _location, numel = pid
        key = str(key)
        storage = self.storages.get(key)
        if storage is None:
            storage = _Storage(self._storage_array(kind.name, key, numel), key)
            self.storages[key] = storage
        return storage

    def _storage_array(self, kind: str, key: str, numel) -> np.ndarray:
        dtype = np.dtype(_STORAGE_DTYPES[kind]).newbyteorder("<" if self.order == "little" else ">")
        data = self.storage_bytes(key)
        if not isinstance(numel, int) or numel < 0 or data.size < numel * dtype.itemsize:
            raise MetalgenError(
                f"{self.where}: storage data/{key} holds {data.size} bytes, less than {numel} x {dtype}"
            )
        array = data[: numel * dtype.itemsize].view(dtype)
        if kind == "BFloat16Storage":
            # bfloat16 is the top half of a float32: shift the 16 bits into place.
            array = (array.astype(np.uint32) << 16).view(np.float32)
            array.flags.writeable = False
        return array

    def _rebuild_tensor(self, storage, offset, size, stride, requires_grad=False, hooks=None, metadata=None):
        """torch._utils._rebuild_tensor_v2 as a numpy view: element offset and strides."""
        if not isinstance(storage, _Storage):
            raise MetalgenError(f"{self.where}: a tensor is rebuilt from something other than a storage")
        size, stride = tuple(size), tuple(stride)
        ints = all(isinstance(v, int) and v >= 0 for v in (offset, *size, *stride))
        if not ints or len(size) != len(stride):
            raise MetalgenError(f"{self.where}: tensor on data/{storage.key} has a bad size {size} or stride {stride}")
        base = storage.array
        if 0 in size:
            empty = np.empty(size, base.dtype)
            empty.flags.writeable = False  # read-only like every other tensor here
            return empty
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= base.size:
            raise MetalgenError(
                f"{self.where}: tensor of size {size} at offset {offset} overruns storage data/{storage.key}"
            )
        return np.lib.stride_tricks.as_strided(
            base[offset:], shape=size, strides=tuple(s * base.itemsize for s in stride), writeable=False
        )


def _rebuild_parameter(data, requires_grad=False, hooks=None):
    """torch._utils._rebuild_parameter: an nn.Parameter is its data here."""
    if not isinstance(data, np.ndarray):
        raise MetalgenError("a pickled parameter wraps something other than a tensor")
    return data
