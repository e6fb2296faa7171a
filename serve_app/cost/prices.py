"""The price book and what a replica costs.

The built-in book is the data file `prices.yaml` beside this module (schema:
`serve_app.config.cost.PriceBook`; `serve-app prices refresh` rewrites it from
the AWS APIs). `Prices.resolve` lays a config's `PriceTable.instances` over a
book and checks each replica shape against the result; everything that prices
a replica goes through a `Prices`.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from serve_app.config.cost import InstancePrice, PriceBook, PriceQuote, PriceTable, ReplicaShape

PRICE_BOOK = Path(__file__).with_name("prices.yaml")
"""The built-in price book (package data)."""
HEADER = ("# Price book (schema: serve_app.config.cost.PriceBook). Every price names its region, date (as_of)\n"
          "# and source. `serve-app prices refresh` rewrites the rows it fetches from the AWS APIs.\n")


def load_price_book(path: Path = PRICE_BOOK) -> PriceBook:
    return PriceBook.model_validate(yaml.safe_load(Path(path).read_text(encoding="utf-8")))


def dump_price_book(book: PriceBook, path: Path) -> None:
    """Write `book` to `path` in one step (a temporary file, given the old file's
    permissions, renamed over it)."""
    text = HEADER + yaml.safe_dump(book.model_dump(mode="json"), sort_keys=False, width=200)
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.chmod(tmp, path.stat().st_mode & 0o777 if path.exists() else 0o644)
    os.replace(tmp, path)


@dataclass(frozen=True)
class Prices:
    """Instance prices (a book with a config's rows laid over it) and the config's replica shapes."""

    instances: Mapping[str, InstancePrice]
    table: PriceTable

    @classmethod
    def resolve(cls, table: PriceTable, book: PriceBook | None = None) -> Prices:
        """`table`'s instances over `book`'s (default: the built-in book); raises
        ValueError for a replica shape whose instance type is unknown or unfit."""
        book = load_price_book() if book is None else book
        prices = cls({**book.instances, **table.instances}, table)
        for key, shape in table.replicas.items():
            prices.check(shape, f"replicas.{key}")
        return prices

    def check(self, shape: ReplicaShape, where: str) -> None:
        instance = self.instances.get(shape.instance_type)
        if instance is None:
            raise ValueError(f"{where}: unknown instance type {shape.instance_type!r}; "
                             f"known: {', '.join(sorted(self.instances))}")
        if shape.gpus_per_replica is not None and instance.gpus == 0:
            raise ValueError(f"{where}: {shape.instance_type} has no GPU")

    def instance_share(self, shape: ReplicaShape) -> float:
        """Instances one replica occupies (a fraction when replicas share one)."""
        instance = self.instances[shape.instance_type]
        if shape.gpus_per_replica is not None:
            return shape.gpus_per_replica / instance.gpus
        if shape.vcpus_per_replica is not None:
            return shape.vcpus_per_replica / instance.vcpus
        return 1.0

    def quote(self, instance_type: str, spot: bool) -> PriceQuote:
        instance = self.instances[instance_type]
        return instance.spot if spot else instance.on_demand

    def instance_hourly_usd(self, instance_type: str, spot: bool) -> float:
        return self.quote(instance_type, spot).hourly_usd

    def replica_hourly_usd(self, model: str, pool: str, spot: bool) -> float:
        shape = self.table.shape(model, pool)
        return self.instance_share(shape) * self.instance_hourly_usd(shape.instance_type, spot)

    def provenance(self, used: Iterable[tuple[str, bool]]) -> dict[str, Any]:
        """The quotes behind `used` (instance type, spot) pairs and their dates."""
        rows: dict[str, dict[str, Any]] = {}
        for instance_type, spot in sorted(set(used)):
            rows.setdefault(instance_type, {})["spot" if spot else "on_demand"] = (
                self.quote(instance_type, spot).model_dump())
        dates = sorted({quote["as_of"] for row in rows.values() for quote in row.values()})
        return {"as_of": dates, "quotes": rows}
