

def test_prices_taken_more_than_a_year_apart_are_flagged():
    from splitplan.specs.hardware import load_hardware, price_date_warning
    a100, h100, h200, b200 = (load_hardware(n) for n in ("a100-80gb", "h100-80gb", "h200-141gb", "b200-180gb"))
    assert price_date_warning([h200, b200]) is None  # both 2026-09
    assert price_date_warning([a100, h100]) is None  # both 2023-11 (Splitwise's own constants)
    warning = price_date_warning([a100, h100, h200])
    assert warning.startswith("prices from 2023-11 (a100-80gb, h100-80gb) and 2026-09 (h200-141gb)")
    newer, older = a100.model_copy(update={"price_date": "2024-11"}), a100.model_copy(update={"name": "x", "price_date": "2023-11"})
    assert price_date_warning([newer, older]) is None
