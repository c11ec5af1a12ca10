"""Writes the hostile PyTorch fixtures: `tests/fixtures/torch/malicious.pkl` (a bare pickle)
and `malicious_zip.pt` (the same pickle as the `data.pkl` of a zip checkpoint), and their
copies in the fuzz corpus. Unpickled by a permissive reader, each runs `echo pwned > nnx-pwned`
through `posix.system`; a safe reader refuses the global by name and runs nothing. The command
writes a relative path, so that no file names a folder of any machine; the tests read the
path back from the pickle and check that the file never appears.

Usage: python3 scripts/malicious_pickles.py   (standard library only)
"""

import io
import os
import pickle
import shutil
import zipfile

COMMAND = "echo pwned > nnx-pwned"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class Payload:
    """Pickles as a call of os.system (`posix.system` on Linux) with COMMAND."""

    def __reduce__(self):
        return (os.system, (COMMAND,))


def main():
    data = pickle.dumps({"w": Payload()}, protocol=2)
    assert b"cposix\nsystem\n" in data, "the global is posix.system"
    torch = os.path.join(ROOT, "tests", "fixtures", "torch")
    with open(os.path.join(torch, "malicious.pkl"), "wb") as out:
        out.write(data)
    archive = io.BytesIO()
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", data)
        zf.writestr("archive/version", b"3\n")
        zf.writestr("archive/byteorder", b"little")
    with open(os.path.join(torch, "malicious_zip.pt"), "wb") as out:
        out.write(archive.getvalue())
    corpus = os.path.join(ROOT, "fuzz", "corpus", "torch")
    for name in ["malicious.pkl", "malicious_zip.pt"]:
        shutil.copyfile(os.path.join(torch, name), os.path.join(corpus, "fixture-" + name))


if __name__ == "__main__":
    main()
