"""recsync/safe_names.py: names read from outside stay in their folder; untrusted text is
quoted printable and short."""

import os

import pytest

from recsync.safe_names import UnsafeName, check_relative, inside, printable, regular_file


@pytest.mark.parametrize("name", ["../x", "a/../../x", "/etc/passwd", "", ".", "a//b", "a\\b",
                                  "a\x00b", "a\nb", "./a", None, 5, ["a"]])
def test_names_that_are_not_plain_relative_names_are_refused(tmp_path, name):
    with pytest.raises(UnsafeName) as e:
        inside(tmp_path, name, where="manifest.json")
    assert str(e.value).startswith("manifest.json: ")
    assert "\n" not in str(e.value)


def test_a_symlink_that_leads_outside_is_refused_and_one_inside_is_kept(tmp_path):
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "escape").symlink_to(outside)
    (root / "sub" / "up").symlink_to(tmp_path)
    (root / "real.txt").write_text("ok")
    (root / "alias").symlink_to(root / "real.txt")
    for name in ("escape", "sub/up/outside.txt"):
        with pytest.raises(UnsafeName, match="leads outside"):
            inside(root, name, where="model.json")
    assert inside(root, "alias", where="model.json") == (root / "real.txt").resolve()
    assert inside(root, "sub/new.txt", where="x") == (root / "sub" / "new.txt").resolve()


def test_a_plain_name_has_no_folder_part(tmp_path):
    assert inside(tmp_path, "a.npz", where="x", plain=True) == (tmp_path / "a.npz").resolve()
    with pytest.raises(UnsafeName, match="without '/'"):
        inside(tmp_path, "sub/a.npz", where="x", plain=True)


def test_a_device_or_fifo_is_not_a_regular_file(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path in (fifo, tmp_path):
        with pytest.raises(UnsafeName, match="not a regular file"):
            regular_file(path, where="ckpt.json")
    (tmp_path / "f").write_text("x")
    assert regular_file(tmp_path / "f", where="x") == tmp_path / "f"
    assert regular_file(tmp_path / "missing", where="x") == tmp_path / "missing"


def test_printable_escapes_control_characters_and_cuts_long_values():
    assert printable("a\x1b[31mb\r\n") == "a\\x1b[31mb\\r\\n"
    assert printable(b"\xff\x00ok") == "\\xff\\x00ok"
    assert printable("x" * 500, limit=10) == "x" * 10 + "..."
    assert printable(12) == "12"
    assert check_relative("a/b.txt", where="x") == "a/b.txt"
