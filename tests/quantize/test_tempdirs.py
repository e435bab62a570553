"""Working folders of killed processes are swept by the next process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from raysearch.quantize.tempdirs import UnsafeFolderError, make_workdir, private_dir, sweep_stale


def test_sweep_removes_only_folders_of_dead_processes(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    dead = int(done.stdout)
    stale = tmp_path / f"rs-test-{dead}-abc"
    mine = tmp_path / f"rs-test-{os.getpid()}-def"
    other = tmp_path / "rs-test-notapid-x"
    for folder in (stale, mine, other):
        folder.mkdir()
    assert sweep_stale("rs-test", tmp_path) == 1
    assert not stale.exists() and mine.exists() and other.exists()


def test_make_workdir_names_the_process():
    folder = make_workdir("rs-test-workdir")
    try:
        assert folder.is_dir() and folder.name.startswith(f"rs-test-workdir-{os.getpid()}-")
    finally:
        folder.rmdir()


# -- private folders of fixed name ------------------------------------------------------------


def test_a_private_folder_is_the_users_own_and_no_one_elses(tmp_path):
    folder = private_dir("raysearch-models", root=tmp_path)
    assert folder == tmp_path / f"raysearch-{os.getuid()}" / "raysearch-models"
    for level in (folder, folder.parent):
        assert level.stat().st_mode & 0o777 == 0o700
        assert level.stat().st_uid == os.getuid()
    assert private_dir("raysearch-models", root=tmp_path) == folder  # found: used again


def test_a_folder_writable_by_others_is_refused_in_one_line(tmp_path):
    planted = tmp_path / f"raysearch-{os.getuid()}"
    planted.mkdir()
    planted.chmod(0o777)
    with pytest.raises(UnsafeFolderError) as refused:
        private_dir("raysearch-models", root=tmp_path)
    assert str(refused.value) == (
        f"{planted}: refusing a temporary folder writable by others (mode 777); remove it, or"
        " set TMPDIR to a folder of your own"
    )
    assert not (planted / "raysearch-models").exists()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user needs root")
def test_a_folder_owned_by_another_user_is_refused_in_one_line(tmp_path):
    import pwd

    nobody = pwd.getpwnam("nobody")
    mine = private_dir(root=tmp_path)
    planted = mine / "raysearch-cache-0123456789ab"
    planted.mkdir(mode=0o700)
    os.chown(planted, nobody.pw_uid, nobody.pw_gid)
    with pytest.raises(UnsafeFolderError) as refused:
        private_dir(planted.name, root=tmp_path)
    assert str(refused.value) == (
        f"{planted}: refusing a temporary folder owned by nobody (uid {nobody.pw_uid}) instead"
        " of root (uid 0); remove it, or set TMPDIR to a folder of your own"
    )


def test_a_link_is_refused_in_one_line(tmp_path):
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    link = tmp_path / f"raysearch-{os.getuid()}"
    link.symlink_to(tmp_path / "elsewhere")
    with pytest.raises(UnsafeFolderError) as refused:
        private_dir(root=tmp_path)
    assert str(refused.value) == (
        f"{link}: refusing a temporary folder that is a link or a file; remove it, or set"
        " TMPDIR to a folder of your own"
    )
