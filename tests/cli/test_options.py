import json

import pytest

from vlmdata.cli import main, parse_storage_options


def test_storage_options_inline_file_and_errors(tmp_path):
    assert parse_storage_options(None) == {}
    assert parse_storage_options('{"anon": true}') == {"anon": True}
    f = tmp_path / "so.json"
    f.write_text(json.dumps({"endpoint_url": "http://127.0.0.1:9"}))
    assert parse_storage_options(f"@{f}") == {"endpoint_url": "http://127.0.0.1:9"}
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_storage_options("{nope")
    with pytest.raises(ValueError, match="JSON object"):
        parse_storage_options("[1, 2]")


@pytest.mark.parametrize("command", [["inspect", "X"], ["index", "X"], ["shard", "X", "-o", "Y"]])
def test_bad_storage_options_exit_2_with_a_message(command, capsys):
    assert main([*command, "--storage-options", "{nope"]) == 2
    assert "--storage-options is not valid JSON" in capsys.readouterr().err
