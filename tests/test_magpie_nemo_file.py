"""metalgen.magpie.nemo_file reads a `.nemo` (tar + YAML config + torch zip checkpoint) without
torch: every tensor as torch.load gives it, the config as PyYAML gives it, and a pickle that
names anything beyond a state dict's vocabulary refused before it can run.

The synthetic tests build their own tiny `.nemo` with torch.save (CI has torch, not the NeMo
venv); the reference tests read the dump's real NeMo files and skip without it."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from magpie_ref.harness import reference_folder
from metalgen.errors import MetalgenError
from metalgen.magpie.nemo_file import read_nemo

CONFIG_TEXT = """\
name: tiny
sample_rate: 22050
scale: 0.5
tiny_float: 1.0e-05
flag: true
other_flag: false
nothing: null
quoted: 'a: b'
dquoted: "x\\ty"
empty_list: []
empty_map: {}
levels:
- 8
- 7
nested:
  _target_: nemo.collections.tts.modules.audio_codec_modules.CausalHiFiGANDecoder
  rates:
  - - 32
    - 8
  - - 64
    - 16
  items:
  - name: first
    value: 1
  - name: second
    value: null
"""


def write_nemo(path: Path, config: str = CONFIG_TEXT, weights: bytes = None, gz: bool = False,
               with_config: bool = True, with_weights: bool = True) -> Path:
    """A .nemo as NeMo lays it out: './model_config.yaml' and './model_weights.ckpt' in a tar."""
    with tarfile.open(path, "w:gz" if gz else "w") as tar:
        members = []
        if with_config:
            members.append(("./model_config.yaml", config.encode()))
        if with_weights:
            members.append(("./model_weights.ckpt", weights))
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


def zip_checkpoint(pickle_bytes: bytes, storages=()) -> bytes:
    """A torch-zip-layout checkpoint around hand-made pickle bytes."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/byteorder", "little")
        for key, data in storages:
            zf.writestr(f"archive/data/{key}", data)
    return buf.getvalue()


# --- synthetic (torch only to write the file, never to read it) ---------------------------------


def torch_state_dict():
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    base = torch.randn(6, 5, generator=g)
    state = {
        "conv.weight": torch.randn(4, 3, 7, generator=g),
        "transposed": base.t(),  # non-contiguous view of `base`'s storage
        "sliced": base[2:, 1:4],  # storage offset + strides
        "base": base,
        "half": torch.randn(3, 2, generator=g).half(),
        "bf16": torch.randn(5, generator=g).bfloat16(),
        "ids": torch.arange(-3, 9, dtype=torch.int64).reshape(3, 4),
        "int32": torch.tensor([[1, 8, 56, 336]], dtype=torch.int32)[:, :, None],
        "mask": torch.tensor([True, False, True]),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 4),
        "param": torch.nn.Parameter(torch.randn(2, 2, generator=g)),
    }
    buf = io.BytesIO()
    torch.save(state, buf)
    return torch, state, buf.getvalue()


@pytest.mark.parametrize("gz", [False, True])
def test_synthetic_nemo_matches_torch(tmp_path, gz, monkeypatch):
    torch, state, ckpt = torch_state_dict()
    path = write_nemo(tmp_path / "tiny.nemo", weights=ckpt, gz=gz)
    monkeypatch.setitem(sys.modules, "torch", None)  # any `import torch` while reading now fails
    config, weights = read_nemo(path)
    monkeypatch.undo()
    assert set(weights) == set(state)
    for key, tensor in state.items():
        want = tensor.detach().float().numpy() if tensor.dtype == torch.bfloat16 else tensor.detach().numpy()
        got = weights[key]
        assert got.dtype == want.dtype, key
        assert got.shape == want.shape, key
        np.testing.assert_array_equal(got, want, err_msg=key)
        assert not got.flags.writeable, key
    # Views of one storage share memory, as they did in torch.
    assert np.shares_memory(weights["transposed"], weights["base"])
    assert np.shares_memory(weights["sliced"], weights["base"])
    yaml = pytest.importorskip("yaml")
    assert config == yaml.safe_load(CONFIG_TEXT)
    assert config["nested"]["rates"] == [[32, 8], [64, 16]] and config["nothing"] is None
    assert config["quoted"] == "a: b" and config["dquoted"] == "x\ty" and config["tiny_float"] == 1e-5


def test_engine_modules_do_not_import_torch():
    code = ("import sys; import metalgen.magpie.nemo_file, metalgen.models.magpie.codec; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


# --- refusals ------------------------------------------------------------------------------


def one_line_error(path) -> str:
    with pytest.raises(MetalgenError) as err:
        read_nemo(path)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_malicious_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    # Protocol 0: GLOBAL 'os system', then os.system("touch <marker>") on load.
    evil = f"cos\nsystem\n(V touch {marker}\ntR.".encode()
    path = write_nemo(tmp_path / "evil.nemo", weights=zip_checkpoint(evil))
    message = one_line_error(path)
    assert "os.system" in message and "evil.nemo" in message
    assert not marker.exists()


def test_unknown_global_in_a_tensor_position_is_refused(tmp_path):
    # A well-formed state dict whose value is built by builtins.eval: refused by name.
    evil = b"\x80\x02ccollections\nOrderedDict\n)RX\x01\x00\x00\x00acbuiltins\neval\nX\x01\x00\x00\x001\x85Rs."
    path = write_nemo(tmp_path / "evil2.nemo", weights=zip_checkpoint(evil))
    assert "builtins.eval" in one_line_error(path)


def test_not_a_tar(tmp_path):
    path = tmp_path / "junk.nemo"
    path.write_bytes(b"this is not an archive at all" * 40)
    assert "not a tar" in one_line_error(path)


def test_missing_config_and_weights(tmp_path):
    ckpt = zip_checkpoint(b"\x80\x02}q\x00.")  # an empty dict
    assert "model_config.yaml" in one_line_error(write_nemo(tmp_path / "a.nemo", weights=ckpt, with_config=False))
    assert "model_weights.ckpt" in one_line_error(write_nemo(tmp_path / "b.nemo", with_weights=False))
    assert "torch's zip format" in one_line_error(write_nemo(tmp_path / "c.nemo", weights=b"\x80\x02}q\x00."))
    assert read_nemo(write_nemo(tmp_path / "d.nemo", weights=ckpt))[1] == {}


def test_missing_file(tmp_path):
    assert "no .nemo file" in one_line_error(tmp_path / "absent.nemo")


# --- the reference dump's real NeMo files ---------------------------------------------------


@pytest.fixture(scope="module")
def ref():
    folder = reference_folder()
    return folder


@pytest.mark.parametrize("name, key", [("magpie.nemo", "magpie_config"), ("codec.nemo", "codec_config")])
def test_reference_nemo_matches_torch_and_yaml(ref, name, key):
    torch = pytest.importorskip("torch")
    yaml = pytest.importorskip("yaml")
    config, weights = read_nemo(ref / name)
    with tarfile.open(ref / name) as tar:
        raw_config = tar.extractfile("./model_config.yaml").read().decode()
        state = torch.load(io.BytesIO(tar.extractfile("./model_weights.ckpt").read()), map_location="cpu",
                           weights_only=True)
    assert config == yaml.safe_load(raw_config)
    # NeMo's own resolved config (OmegaConf.to_container(resolve=True)) agrees too.
    assert config == json.loads((ref / "magpie.json").read_text())[key]
    assert set(weights) == set(state)
    for k, tensor in state.items():
        want = tensor.numpy()
        assert weights[k].dtype == want.dtype and weights[k].shape == want.shape, k
        np.testing.assert_array_equal(weights[k], want, err_msg=k)
