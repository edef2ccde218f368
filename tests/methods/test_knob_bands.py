"""A ratio band must hold 1, the ratio of every on-policy token: a band without it would mask (SAO) or zero
(Async icepop) the whole batch even with no lag at all. SAO's band is open (a ratio on its end is masked), so
1 must lie strictly inside; icepop's is closed."""

import pytest

import whileai as wai
from whileai.errors import ConfigError


@pytest.mark.parametrize("band", [(1.2, 3.0), (0.2, 0.9)])
def test_a_band_that_leaves_out_one_is_refused(band):
    with pytest.raises(ConfigError, match="with low < 1 < high"):
        wai.SAO(ratio=band)
    with pytest.raises(ConfigError, match="with low <= 1 <= high"):
        wai.Async("grpo", correction="icepop", ratio=band)


@pytest.mark.parametrize("band", [(0.7, 6.0), (0.99, 1.01), (0.0, 1e300)])
def test_a_band_holding_one_is_accepted(band):
    assert wai.SAO(ratio=band).ratio == band
    assert wai.Async("grpo", correction="icepop", ratio=band).ratio == band


@pytest.mark.parametrize("band", [(1.0, 2.0), (0.5, 1.0)])
def test_a_band_ending_at_one_is_closed_for_icepop_and_open_for_sao(band):
    """SAO masks a ratio on the band's end (strictly inside: 1 < 1 is false), so (1.0, 2.0) would mask every
    on-policy token; icepop keeps it (inclusive)."""
    with pytest.raises(ConfigError, match="with low < 1 < high"):
        wai.SAO(ratio=band)
    assert wai.Async("grpo", correction="icepop", ratio=band).ratio == band
