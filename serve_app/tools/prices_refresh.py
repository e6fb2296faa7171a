"""`serve-app prices refresh`: rewrite the price book's instance rows from the AWS APIs.

    serve-app prices refresh                       # every instance type in the book, us-east-1
    serve-app prices refresh --instance-type g6e.xlarge --region us-west-2 --file my-prices.yaml

On-demand: the AWS Pricing API (`pricing.get_products`, endpoint us-east-1), Linux,
shared tenancy, no pre-installed software, in `--region`. Spot: EC2
`describe_spot_price_history` in `--region`, Linux/UNIX, each Availability Zone's
latest price, their median. Each refreshed row gets today's date and names the
API it came from. Without boto3 or AWS credentials it says so and exits 2; on
any API error it exits 1; either way the file is left as it was.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from serve_app.config.cost import InstancePrice, PriceBook, PriceQuote
from serve_app.cost.prices import PRICE_BOOK, dump_price_book, load_price_book
from serve_app.quantile import quantile

PRICING_REGION = "us-east-1"
"""The region of the Pricing API endpoint (it serves every region's prices)."""
ON_DEMAND_FILTERS = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
                     "capacitystatus": "Used", "licenseModel": "No License required"}
"""Pricing API attributes that pick the plain Linux on-demand price of an instance type."""
SPOT_PRODUCT = "Linux/UNIX"


def on_demand(pricing: Any, instance_type: str, region: str, today: str) -> tuple[PriceQuote, int, int]:
    """The on-demand quote of `instance_type` in `region`, and its GPUs and vCPUs."""
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value}
               for field, value in {"instanceType": instance_type, "regionCode": region, **ON_DEMAND_FILTERS}.items()]
    hourly: set[float] = set()
    size: tuple[int, int] | None = None
    request: dict[str, Any] = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1",
                               "MaxResults": 100}
    while True:
        page = pricing.get_products(**request)
        for item in page["PriceList"]:  # each a JSON document in a string
            product = json.loads(item)
            attributes = product["product"]["attributes"]
            size = (int(attributes.get("gpu") or 0), int(attributes["vcpu"]))
            for term in product["terms"].get("OnDemand", {}).values():
                hourly.update(float(dim["pricePerUnit"]["USD"]) for dim in term["priceDimensions"].values()
                              if dim["unit"] == "Hrs" and float(dim["pricePerUnit"]["USD"]) > 0)
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    if size is None or len(hourly) != 1:
        raise ValueError(f"Pricing API: {instance_type} in {region}: expected one Linux on-demand hourly price, "
                         f"got {sorted(hourly) or 'none'}")
    source = ("AWS Pricing API get_products (AmazonEC2; Linux, shared tenancy, no pre-installed software, "
              "on-demand)")
    return PriceQuote(hourly_usd=hourly.pop(), region=region, as_of=today, source=source), *size


def spot(ec2: Any, instance_types: Iterable[str], region: str, today: str,
         now: datetime.datetime) -> dict[str, PriceQuote]:
    """Each instance type's Spot quote: the median of its Availability Zones' latest prices."""
    latest: dict[tuple[str, str], tuple[datetime.datetime, float]] = {}
    request: dict[str, Any] = {"InstanceTypes": sorted(instance_types), "ProductDescriptions": [SPOT_PRODUCT],
                               "StartTime": now}
    while True:
        page = ec2.describe_spot_price_history(**request)
        for record in page["SpotPriceHistory"]:
            key = (record["InstanceType"], record["AvailabilityZone"])
            if key not in latest or record["Timestamp"] > latest[key][0]:
                latest[key] = (record["Timestamp"], float(record["SpotPrice"]))
        if not page.get("NextToken"):
            break
        request["NextToken"] = page["NextToken"]
    quotes = {}
    for instance_type in request["InstanceTypes"]:
        prices = [price for (kind, _), (_, price) in latest.items() if kind == instance_type]
        if not prices:
            raise ValueError(f"EC2 spot price history: no {SPOT_PRODUCT} price for {instance_type} in {region}")
        source = (f"AWS EC2 describe_spot_price_history ({SPOT_PRODUCT}): median of {len(prices)} Availability "
                  f"Zones' latest prices (${min(prices):g}-${max(prices):g}/h)")
        quotes[instance_type] = PriceQuote(hourly_usd=round(quantile(prices, 0.5), 6), region=region, as_of=today,
                                           source=source)
    return quotes


def refresh(book: PriceBook, pricing: Any, ec2: Any, instance_types: Iterable[str], region: str,
            now: datetime.datetime) -> PriceBook:
    """`book` with the rows of `instance_types` read anew (other rows and hosted models kept)."""
    today = now.date().isoformat()
    types = list(dict.fromkeys(instance_types))
    spot_quotes = spot(ec2, types, region, today, now)
    rows = dict(book.instances)
    for instance_type in types:
        quote, gpus, vcpus = on_demand(pricing, instance_type, region, today)
        rows[instance_type] = InstancePrice(gpus=gpus, vcpus=vcpus, on_demand=quote, spot=spot_quotes[instance_type])
    return book.model_copy(update={"instances": rows})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, default=PRICE_BOOK, help="price book to rewrite (default: the built-in)")
    parser.add_argument("--region", default="us-east-1", help="region whose prices to read (default: %(default)s)")
    parser.add_argument("--instance-type", action="append", default=[],
                        help="instance type to refresh or add (repeatable; default: every type in the file)")


def run(args: argparse.Namespace) -> int:
    untouched = f"{args.file} not touched"
    try:
        import boto3
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        print(f"boto3 is not installed (pip install 'serve-app[aws]'); {untouched}", file=sys.stderr)
        return 2
    session = boto3.Session()
    if session.get_credentials() is None:
        print(f"no AWS credentials found (environment, shared files, SSO or instance role); {untouched}",
              file=sys.stderr)
        return 2
    book = load_price_book(args.file)
    types = args.instance_type or list(book.instances)
    try:
        new = refresh(book, session.client("pricing", region_name=PRICING_REGION),
                      session.client("ec2", region_name=args.region), types, args.region,
                      datetime.datetime.now(datetime.UTC))
    except (BotoCoreError, ClientError, ValueError) as exc:
        print(f"refresh failed: {exc}; {untouched}", file=sys.stderr)
        return 1
    dump_price_book(new, args.file)
    for instance_type in types:
        row = new.instances[instance_type]
        print(f"{instance_type}: on-demand ${row.on_demand.hourly_usd}/h, Spot ${row.spot.hourly_usd}/h "
              f"({args.region}, {row.on_demand.as_of})")
    print(f"wrote {args.file}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="serve-app prices refresh", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
