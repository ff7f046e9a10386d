"""Source packages nobody here wrote, pinned by version and checksum, fetched once with each registry's own client
(``pip download`` an sdist, ``npm pack`` a tarball, ``apt-get download`` a Debian Go package) and unpacked under
``.cache/repo-sources/``: the workspaces of ``repo_context_eval``'s cursor cases.

    python -m benchmarks.repo_sources    # fetch them all (the benchmark fetches what it is asked for)
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import attrs

CACHE = Path(__file__).resolve().parents[1] / ".cache" / "repo-sources"
FETCH_TIMEOUT_S = 120


class SourceUnavailable(RuntimeError):
    """A source could not be fetched (no network, the registry refused) or its checksum is not the pinned one."""


@attrs.frozen(kw_only=True)
class Source:
    name: str
    registry: str
    """``pypi``, ``npm`` or ``debian``."""
    version: str
    sha256: str
    """Of the downloaded archive."""
    package: str = ""
    """The folder of the archive's tree that is the workspace (``src/jinja2``): a package's own modules."""

    @property
    def folder(self) -> Path:
        return CACHE / f"{self.name}-{self.version}"


SOURCES = (
    Source(
        name="jinja2",
        registry="pypi",
        version="3.1.4",
        sha256="4a3aee7acbbe7303aede8e9648d13b8bf88a429282aa6122a993f0ac800cb369",
        package="jinja2-3.1.4/src",
    ),
    Source(
        name="requests",
        registry="pypi",
        version="2.32.3",
        sha256="55365417734eb18255590a9ff9eb97e9e1da868d4ccd6402399eaf68af20a760",
        package="requests-2.32.3/src",
    ),
    Source(
        name="click",
        registry="pypi",
        version="8.1.7",
        sha256="ca9853ad459e787e2192211578cc907e7594e294c7ccc834310722b41b9ca6de",
        package="click-8.1.7/src",
    ),
    Source(
        name="httpx",
        registry="pypi",
        version="0.27.0",
        sha256="a0cb88a46f32dc874e04ee956e4c2764aba2aa228f650b06788ba6bda2962ab5",
        package="httpx-0.27.0",
    ),
    Source(
        name="rxjs",
        registry="npm",
        version="7.8.1",
        sha256="c532167725ab7d085123209156c93cef22f2479cb9c8527060f1cd903aa9d149",
        package="package/src",
    ),
    Source(
        name="preact",
        registry="npm",
        version="10.22.0",
        sha256="0e4ff39b2a63f38a860205485efecfd4025d52d51cc139b8f70f9fa3abe15479",
        package="package/src",
    ),
    Source(
        name="golang-github-hashicorp-hcl-dev",
        registry="debian",
        version="1.0.0-1.1",
        sha256="be4123b5032261eb35e7420331064cfbc58c76b9b11a7c9c8d2209700fe062f8",
        package="usr/share/gocode/src/github.com/hashicorp/hcl",
    ),
    Source(
        name="golang-github-google-go-cmp-dev",
        registry="debian",
        version="0.5.9-1",
        sha256="b68bd919daa7c1bdf02abfb68894e29e532f19b03b68c8615f50626c48f553b6",
        package="usr/share/gocode/src/github.com/google/go-cmp",
    ),
)
BY_NAME = {source.name: source for source in SOURCES}


def workspace(source: Source) -> Path:
    """The unpacked package's folder, fetched first if it is not cached; ``SourceUnavailable`` if it cannot be."""
    done = source.folder / ".complete"
    if not done.is_file():
        _fetch(source)
        done.touch()
    return source.folder / source.package


def _download_command(source: Source, into: Path) -> list[str]:
    if source.registry == "pypi":
        spec = f"{source.name}=={source.version}"
        return [
            sys.executable,
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--no-binary",
            ":all:",
            spec,
            "-d",
            str(into),
        ]
    if source.registry == "npm":
        return ["npm", "pack", "-q", "--pack-destination", str(into), f"{source.name}@{source.version}"]
    return ["apt-get", "download", "-q", f"{source.name}={source.version}"]


def _fetch(source: Source) -> None:
    with tempfile.TemporaryDirectory(prefix="dg-source-") as scratch:
        into = Path(scratch)
        command = _download_command(source, into)
        if shutil.which(command[0]) is None:
            raise SourceUnavailable(f"{source.name}: {command[0]} is not installed")
        try:
            done = subprocess.run(command, cwd=into, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            raise SourceUnavailable(f"{source.name}: {' '.join(command)} timed out") from exc
        archives = [path for path in into.iterdir() if path.is_file()]
        if done.returncode != 0 or len(archives) != 1:
            raise SourceUnavailable(f"{source.name}: {' '.join(command)} failed: {done.stderr.strip()[-300:]}")
        (archive,) = archives
        digest = hashlib.sha256(archive.read_bytes()).hexdigest()
        if digest != source.sha256:
            raise SourceUnavailable(f"{source.name}: sha256 {digest}, pinned {source.sha256}")
        unpacked = into / "unpacked"
        unpacked.mkdir()
        if source.registry == "debian":
            subprocess.run(["dpkg-deb", "-x", str(archive), str(unpacked)], check=True, timeout=FETCH_TIMEOUT_S)
        else:
            with tarfile.open(archive) as tar:
                tar.extractall(unpacked, filter="data")
        if source.folder.exists():
            shutil.rmtree(source.folder)
        source.folder.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(unpacked), source.folder)


def main() -> None:
    for source in SOURCES:
        try:
            print(source.name, workspace(source))
        except SourceUnavailable as exc:
            print(f"unavailable: {exc}", file=sys.stderr)


if __name__ == "__main__":
    main()
