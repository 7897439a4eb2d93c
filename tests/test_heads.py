"""The head spec syntax and its errors."""
import json

import pytest

from fairseq_headprune.core.heads import Head, HeadLayout, HeadSpecError, format_head_spec, parse_head_spec

LAYOUT = HeadLayout(
    heads={**{("enc-self", i): tuple(range(1, 9)) for i in range(1, 5)},
           **{(t, i): tuple(range(1, 5)) for t in ("enc-dec", "dec-self") for i in range(1, 4)}},
    original_heads={**{("enc-self", i): 8 for i in range(1, 5)},
                    **{(t, i): 4 for t in ("enc-dec", "dec-self") for i in range(1, 4)}},
)


def test_numbers_ranges_and_lists():
    heads = parse_head_spec("enc-self:1:2+5, enc-dec:3:1-3,dec-self:2:4")
    assert heads == [Head("enc-self", 1, 2), Head("enc-self", 1, 5), Head("enc-dec", 3, 1), Head("enc-dec", 3, 2),
                     Head("enc-dec", 3, 3), Head("dec-self", 2, 4)]
    assert parse_head_spec(format_head_spec(heads)) == heads
    assert parse_head_spec("enc-self:1:1-2+2") == [Head("enc-self", 1, 1), Head("enc-self", 1, 2)]
    assert parse_head_spec("") == []


def test_json_file_same_structure(tmp_path):
    path = tmp_path / "heads.json"
    path.write_text(json.dumps({"enc-self": {"1": [2, 5]}, "enc-dec": {"3": "1-3"}, "dec-self": {"2": [4]}}))
    assert parse_head_spec(f"@{path}") == parse_head_spec("enc-self:1:2+5,enc-dec:3:1-3,dec-self:2:4")


@pytest.mark.parametrize(
    "spec, message",
    [
        ("enc-sel:1:1", "unknown attention type 'enc-sel'"),
        ("enc-self:0:1", "layers are numbered from 1"),
        ("enc-self:1:0", "heads are numbered from 1"),
        ("garbage", "expected TYPE:LAYER:HEADS"),
        ("enc-self:1:", "expected TYPE:LAYER:HEADS"),
        ("enc-self:1:3-1", "start after end"),
        ("enc-self:1:1--2", "bad heads"),
        ("@/nonexistent/heads.json", "cannot read head spec file"),
    ],
)
def test_syntax_errors(spec, message):
    with pytest.raises(HeadSpecError, match=message) as err:
        parse_head_spec(spec)
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("enc-self:5:1", "enc-self layer 5 does not exist: layers are 1..4"),
        ("dec-self:4:1", "dec-self layer 4 does not exist: layers are 1..3"),
        ("enc-dec:1:5", "enc-dec layer 1 has no head 5: heads are 1..4"),
        ("enc-self:2:9", "enc-self layer 2 has no head 9: heads are 1..8"),
    ],
)
def test_shape_errors_name_the_real_shape(spec, message):
    with pytest.raises(HeadSpecError, match=message) as err:
        LAYOUT.check(parse_head_spec(spec))
    assert str(err.value).endswith(
        "(the model has enc-self 4 layers x 8 heads, enc-dec 3 layers x 4 heads, dec-self 3 layers x 4 heads)"
    )


def test_bad_json_contents(tmp_path):
    for content, message in [("{", "not valid JSON"), ("[1]", "must hold an object"),
                             ('{"enc-self": [1]}', "must map layer numbers"),
                             ('{"enc-self": {"x": [1]}}', "bad layer"),
                             ('{"enc-self": {"1": [true]}}', "must be a list of numbers")]:
        path = tmp_path / "bad.json"
        path.write_text(content)
        with pytest.raises(HeadSpecError, match=message):
            parse_head_spec(f"@{path}")
