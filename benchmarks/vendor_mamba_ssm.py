"""Copy mamba_ssm's Triton SSD scan and gated RMSNorm (the peer of benchmarks/peers.py's Mamba-2 cases)
into benchmarks/third_party/mamba_ssm, for a GPU machine that has no network and no mamba_ssm package.

    python benchmarks/vendor_mamba_ssm.py [--source /work/.mirror/state-spaces+mamba/repo] [--commit HEAD]

`--source`: a git repository of state-spaces/mamba (bare or not; files read at `--commit`) or an unpacked
sdist (a folder holding mamba_ssm/). The copy starts from the modules peers.py calls (ssd_combined,
layernorm_gated, layer_norm) and follows their module-level `from mamba_ssm… import` lines; imports
inside functions (selective_scan, reached only by the reference paths peers.py does not call) and
causal_conv1d (which ssd_combined imports inside try/except) are left out. The packages' __init__.py files
are written empty: mamba_ssm's own imports its CUDA extensions. Its LICENSE (Apache-2.0) goes beside the
copy, and SOURCE.json records where the files came from (source, commit, version, files).

benchmarks/third_party/ is git-ignored: a device run carries it (`carry: ["benchmarks/third_party"]`).
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_SOURCE = "/work/.mirror/state-spaces+mamba/repo"
OUT = Path(__file__).resolve().parent / "third_party"
ROOTS = ("mamba_ssm/ops/triton/ssd_combined.py", "mamba_ssm/ops/triton/layernorm_gated.py")
ROOTS += ("mamba_ssm/ops/triton/layer_norm.py",)


class Source:
    """Files of a mamba checkout: a git repository read at one commit, or a plain folder."""

    def __init__(self, path: str, commit: str):
        self.path = Path(path)
        self.git = not (self.path / "mamba_ssm" / "__init__.py").is_file()  # an unpacked sdist has one
        self.commit = _git(self.path, "rev-parse", commit).strip() if self.git else None

    def read(self, name: str) -> str:
        if self.git:
            return _git(self.path, "show", f"{self.commit}:{name}")
        return (self.path / name).read_text()


def _git(path: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(path), *args], check=True, capture_output=True, text=True).stdout


def module_imports(text: str) -> list[str]:
    """The mamba_ssm modules a file imports at module level (outside functions and classes)."""
    out = []
    for node in ast.parse(text).body:
        stack = [node]
        while stack:  # module level includes if/try blocks, not def or class bodies
            n = stack.pop()
            if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("mamba_ssm"):
                out.append(n.module)
            elif isinstance(n, ast.Import):
                out += [a.name for a in n.names if a.name.startswith("mamba_ssm")]
            elif isinstance(n, (ast.If, ast.Try)):
                stack += n.body + n.orelse + getattr(n, "finalbody", [])
                stack += [s for h in getattr(n, "handlers", []) for s in h.body]
    return out


def closure(source: Source) -> dict[str, str]:
    """{path: text} of the roots and every mamba_ssm module they import at module level."""
    files, todo = {}, list(ROOTS)
    while todo:
        name = todo.pop()
        if name in files:
            continue
        files[name] = source.read(name)
        todo += [m.replace(".", "/") + ".py" for m in module_imports(files[name])]
    return files


def vendor(source: Source, out: Path) -> dict:
    """Write the copy under `out`; returns what SOURCE.json records."""
    files = closure(source)
    shutil.rmtree(out / "mamba_ssm", ignore_errors=True)  # no file of an earlier copy stays behind
    for name, text in files.items():
        dest = out / name
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
    packages = {str(Path(n).parent) for n in files}
    packages |= {str(p) for n in packages for p in Path(n).parents if str(p) != "."}
    for package in sorted(packages):  # empty: mamba_ssm/__init__.py imports the CUDA extensions
        (out / package / "__init__.py").write_text("")
    (out / "mamba_ssm" / "LICENSE").write_text(source.read("LICENSE"))
    version = re.search(r'__version__ = "([^"]+)"', source.read("mamba_ssm/__init__.py"))
    record = {
        "command": " ".join(["python benchmarks/vendor_mamba_ssm.py", *sys.argv[1:]]),
        "source": str(source.path),
        "commit": source.commit,
        "version": version.group(1) if version else None,
        "license": "Apache-2.0 (mamba_ssm/LICENSE)",
        "files": sorted(files),
    }
    (out / "mamba_ssm" / "SOURCE.json").write_text(json.dumps(record, indent=1) + "\n")
    return record


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", default=DEFAULT_SOURCE, help="a state-spaces/mamba git repository or sdist folder")
    ap.add_argument("--commit", default="HEAD", help="the commit to read (git sources)")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    try:
        record = vendor(Source(args.source, args.commit), Path(args.out))
    except subprocess.CalledProcessError as err:  # not a git repository, or no such commit
        print(f"--source/--commit: git could not read {args.source} at {args.commit}: {err.stderr.strip()}")
        return 2
    except FileNotFoundError as err:
        print(f"--source: {args.source} has no {err.filename}; give a mamba git checkout or an unpacked sdist")
        return 2
    print(f"mamba_ssm {record['version']} ({record['commit'] or 'sdist'}): {len(record['files'])} files in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
