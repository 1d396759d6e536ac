"""The Markdown block parser used by the docs tests (it must find what the docs hold)."""
import pytest

from doc_blocks import code_blocks, shell_commands


def test_blocks_languages_marks_and_lines(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("# t\n\n```yaml\na: 1\n```\n\n<!-- check: invalid -->\n\n```bash\n"
                  "python x.py --a 1\n```\n\n```\nplain\n```\n", encoding="utf-8")
    blocks = code_blocks(str(md))
    assert [(b.lang, b.line, b.mark) for b in blocks] == [
        ("yaml", 3, None), ("bash", 9, "invalid"), ("", 13, None)]
    assert blocks[0].text == "a: 1"


def test_unterminated_fence_is_an_error(tmp_path):
    md = tmp_path / "bad.md"
    md.write_text("```yaml\na: 1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="unterminated code fence"):
        code_blocks(str(md))


def test_shell_commands_split_join_and_strip():
    text = ("# comment\nA=1 python run.py --x 1 \\\n   --y 'two words'\n"
            "cd /w && python -m bench --quick; echo done | tee f\n")
    assert shell_commands(text) == [
        ["python", "run.py", "--x", "1", "--y", "two words"],
        ["cd", "/w"], ["python", "-m", "bench", "--quick"], ["echo", "done"], ["tee", "f"]]
