"""The ferrymq sink's direct properties of a row without headers or tags (spark/sink.py).

`_key_properties` formats KEYS and UNIQ_KEY itself instead of building a dict for
`encode_properties`: the bytes, and the error for a key holding a separator, must be the same.
"""

from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ferrymq.spark.sink import _key_properties
from ferrymq.wire import properties as props
from ferrymq.wire.properties import encode_properties


@given(key=st.none() | st.text(), unique=st.text(alphabet="0123456789ABCDEF", max_size=32))
def test_direct_properties_equal_encode_properties(key: str | None, unique: str) -> None:
    wanted = {props.UNIQ_KEY: unique} if key is None else {props.KEYS: key, props.UNIQ_KEY: unique}

    def outcome(encode: Callable[[], bytes]) -> bytes | str:
        try:
            return encode()
        except ValueError as exc:
            return f"ValueError: {exc}"

    assert outcome(lambda: _key_properties(key, unique)) == outcome(
        lambda: encode_properties(wanted)
    )


def test_a_key_with_a_separator_is_refused_as_before() -> None:
    with pytest.raises(ValueError, match="'KEYS' contains a"):
        _key_properties("a\x01b", "00FF")
