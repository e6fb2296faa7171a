"""The price book: the built-in data file and its provenance, a config's rows laid
over it, shape checks, writing it back, and the config staying at the bottom."""

from __future__ import annotations

import ast
import tomllib

import pytest

from serve_app.config import PriceTable
from serve_app.config.cost import PriceBook
from serve_app.cost.prices import PRICE_BOOK, Prices, dump_price_book, load_price_book
from tests.conftest import REPO


def test_the_built_in_book_gives_every_price_its_region_date_and_source():
    book = load_price_book()
    assert {"g5.2xlarge", "g6e.xlarge", "p5.48xlarge", "m7i.2xlarge"} <= set(book.instances)
    for name, row in book.instances.items():
        assert row.spot.hourly_usd < row.on_demand.hourly_usd, name
        for quote in (row.on_demand, row.spot):
            assert quote.region and quote.as_of and quote.source, name
            # what is in the file today was written by hand: it must say so
            assert quote.source.startswith("hand-written") and "not fetched" in quote.source, name
            assert quote.as_of == "2026-12", name
    hosted = book.hosted_models
    assert hosted and all(p.usd_per_1m_output_tokens > 0 and p.as_of and p.source for p in hosted.values())


def test_the_book_ships_as_package_data():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert PRICE_BOOK.name in pyproject["tool"]["setuptools"]["package-data"]["serve_app.cost"]
    assert PRICE_BOOK.parent == REPO / "serve_app" / "cost"


def test_a_config_row_replaces_or_adds_to_the_book():
    row = {"gpus": 1, "vcpus": 4, "on_demand": {"hourly_usd": 9.0, "region": "eu-west-1", "as_of": "2026-12-02",
                                                "source": "our contract"},
           "spot": {"hourly_usd": 3.0, "region": "eu-west-1", "as_of": "2026-12-02", "source": "our contract"}}
    table = PriceTable.model_validate({"instances": {"g6e.xlarge": row, "custom.large": row},
                                       "replicas": {"m": {"instance_type": "custom.large"}}})
    prices = Prices.resolve(table)
    assert prices.instance_hourly_usd("g6e.xlarge", spot=False) == 9.0
    assert prices.replica_hourly_usd("m", "default", spot=True) == 3.0
    assert prices.instance_hourly_usd("p5.48xlarge", spot=False) == load_price_book().instances[
        "p5.48xlarge"].on_demand.hourly_usd


def test_replica_shapes_are_checked_against_the_book():
    with pytest.raises(ValueError, match="unknown instance type 'nope'"):
        Prices.resolve(PriceTable.model_validate({"replicas": {"m": {"instance_type": "nope"}}}))
    with pytest.raises(ValueError, match="has no GPU"):
        Prices.resolve(PriceTable.model_validate(
            {"replicas": {"m": {"instance_type": "m7i.2xlarge", "gpus_per_replica": 1}}}))
    with pytest.raises(ValueError, match="Extra inputs"):
        PriceTable.model_validate({"replicas": {"m": {"instance_type": "g5.2xlarge", "gpu": 1}}})


def test_a_row_without_provenance_or_with_a_bad_date_is_refused():
    book = load_price_book().model_dump(mode="json")
    del book["instances"]["g5.2xlarge"]["spot"]["source"]
    with pytest.raises(ValueError, match="source"):
        PriceBook.model_validate(book)
    book = load_price_book().model_dump(mode="json")
    book["instances"]["g5.2xlarge"]["on_demand"]["as_of"] = "last week"
    with pytest.raises(ValueError, match="as_of"):
        PriceBook.model_validate(book)


def test_dump_and_load_round_trip_and_yaml_dates_are_read_as_text(tmp_path):
    path = tmp_path / "prices.yaml"
    dump_price_book(load_price_book(), path)
    assert load_price_book(path) == load_price_book()
    text = path.read_text().replace("as_of: 2026-12\n", "as_of: 2026-12-05\n", 1)  # a YAML date, unquoted
    path.write_text(text)
    assert "2026-12-05" in {q.as_of for row in load_price_book(path).instances.values()
                            for q in (row.on_demand, row.spot)}


def test_the_config_package_imports_nothing_else_from_the_project():
    for module in (REPO / "serve_app" / "config").glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [alias.name for alias in node.names] if isinstance(node, ast.Import) else [])
            for name in names:
                assert not name.startswith("serve_app") or name.startswith("serve_app.config"), (module, name)
