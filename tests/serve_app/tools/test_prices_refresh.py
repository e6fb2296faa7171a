"""`serve-app prices refresh` against stubbed AWS clients (`botocore.stub.Stubber`,
the APIs' real response shapes; nothing is sent): on-demand from the Pricing
API's JSON-string PriceList, Spot as the median of Availability Zones, today's
date and the API named on each refreshed row, the file left alone on failure."""

from __future__ import annotations

import argparse
import datetime
import json

import boto3
import pytest
from botocore.stub import ANY, Stubber

from serve_app.cost.prices import dump_price_book, load_price_book
from serve_app.tools import prices_refresh
from serve_app.tools.prices_refresh import ON_DEMAND_FILTERS, refresh

NOW = datetime.datetime(2026, 12, 5, 12, 0, tzinfo=datetime.UTC)


def client(service: str, region: str):
    return boto3.client(service, region_name=region, aws_access_key_id="testing", aws_secret_access_key="testing")


def price_list_item(instance_type: str, usd: str, gpus: str | None = "1", vcpus: str = "4") -> str:
    """One PriceList entry as the Pricing API sends it: a JSON document in a string."""
    attributes = {"instanceType": instance_type, "vcpu": vcpus, "regionCode": "us-east-1", "operatingSystem": "Linux",
                  "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used", "memory": "32 GiB",
                  "licenseModel": "No License required", "location": "US East (N. Virginia)"}
    if gpus is not None:
        attributes["gpu"] = gpus
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": "SKU123"},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {"SKU123.JRTCKXETXF": {
            "priceDimensions": {"SKU123.JRTCKXETXF.6YS6EN2CT7": {
                "unit": "Hrs", "endRange": "Inf", "beginRange": "0", "appliesTo": [], "rateCode": "SKU123.JRTCKXETXF.6YS6EN2CT7",
                "description": f"${usd} per On Demand Linux {instance_type} Instance Hour",
                "pricePerUnit": {"USD": usd}}},
            "sku": "SKU123", "effectiveDate": "2026-11-01T00:00:00Z", "offerTermCode": "JRTCKXETXF",
            "termAttributes": {}}}},
        "version": "20261101000000", "publicationDate": "2026-11-01T00:00:00Z",
    })


def expect_products(stub: Stubber, instance_type: str, pages: list[list[str]]) -> None:
    filters = [{"Type": "TERM_MATCH", "Field": field, "Value": value}
               for field, value in {"instanceType": instance_type, "regionCode": "us-east-1",
                                    **ON_DEMAND_FILTERS}.items()]
    for index, page in enumerate(pages):
        expected = {"ServiceCode": "AmazonEC2", "Filters": filters, "FormatVersion": "aws_v1", "MaxResults": 100}
        response = {"FormatVersion": "aws_v1", "PriceList": page}
        if index:
            expected["NextToken"] = f"token{index}"
        if index < len(pages) - 1:
            response["NextToken"] = f"token{index + 1}"
        stub.add_response("get_products", response, expected)


def spot_record(instance_type: str, zone: str, usd: str, minutes_ago: int) -> dict:
    return {"AvailabilityZone": zone, "InstanceType": instance_type, "ProductDescription": "Linux/UNIX",
            "SpotPrice": usd, "Timestamp": NOW - datetime.timedelta(minutes=minutes_ago)}


@pytest.fixture
def stubs():
    pricing, ec2 = client("pricing", "us-east-1"), client("ec2", "us-east-1")
    with Stubber(pricing) as pricing_stub, Stubber(ec2) as ec2_stub:
        yield pricing, pricing_stub, ec2, ec2_stub
        pricing_stub.assert_no_pending_responses()
        ec2_stub.assert_no_pending_responses()


def test_refresh_reads_both_apis_and_dates_and_sources_each_row(stubs):
    pricing, pricing_stub, ec2, ec2_stub = stubs
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        spot_record("g6e.xlarge", "us-east-1a", "0.7000", 5), spot_record("g6e.xlarge", "us-east-1b", "0.9000", 9),
        spot_record("g6e.xlarge", "us-east-1a", "0.6500", 90),  # older: the later one counts
        spot_record("m7i.2xlarge", "us-east-1c", "0.1500", 3)], "NextToken": "more"},
        {"InstanceTypes": ["g6e.xlarge", "m7i.2xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW})
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        spot_record("g6e.xlarge", "us-east-1d", "0.8000", 1)], "NextToken": ""},
        {"InstanceTypes": ANY, "ProductDescriptions": ANY, "StartTime": ANY, "NextToken": "more"})
    expect_products(pricing_stub, "g6e.xlarge", [[], [price_list_item("g6e.xlarge", "1.8610000000")]])
    expect_products(pricing_stub, "m7i.2xlarge", [[price_list_item("m7i.2xlarge", "0.4032000000", None, "8")]])
    old = load_price_book()
    new = refresh(old, pricing, ec2, ["g6e.xlarge", "m7i.2xlarge"], "us-east-1", NOW)
    g6e = new.instances["g6e.xlarge"]
    assert (g6e.on_demand.hourly_usd, g6e.gpus, g6e.vcpus) == (1.861, 1, 4)
    assert g6e.spot.hourly_usd == pytest.approx(0.8)  # the median of three zones: 0.70 (not 0.65), 0.90, 0.80
    assert "3 Availability Zones" in g6e.spot.source and "describe_spot_price_history" in g6e.spot.source
    assert "Pricing API get_products" in g6e.on_demand.source
    assert {q.as_of for q in (g6e.on_demand, g6e.spot)} == {"2026-12-05"} and g6e.spot.region == "us-east-1"
    m7i = new.instances["m7i.2xlarge"]
    assert (m7i.gpus, m7i.vcpus, m7i.spot.hourly_usd) == (0, 8, 0.15)
    assert new.instances["p5.48xlarge"] == old.instances["p5.48xlarge"]  # not asked for: kept as it was
    assert new.hosted_models == old.hosted_models


def test_two_different_on_demand_prices_are_refused(stubs):
    pricing, pricing_stub, ec2, ec2_stub = stubs
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        spot_record("g6e.xlarge", "us-east-1a", "0.7", 1)]})
    expect_products(pricing_stub, "g6e.xlarge", [[price_list_item("g6e.xlarge", "1.861"),
                                                  price_list_item("g6e.xlarge", "2.0")]])
    with pytest.raises(ValueError, match="expected one Linux on-demand hourly price"):
        refresh(load_price_book(), pricing, ec2, ["g6e.xlarge"], "us-east-1", NOW)


def test_an_instance_type_without_spot_prices_is_refused(stubs):
    _, _, ec2, ec2_stub = stubs
    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": []})
    with pytest.raises(ValueError, match="no Linux/UNIX price for g6e.xlarge"):
        refresh(load_price_book(), None, ec2, ["g6e.xlarge"], "us-east-1", NOW)


class FakeSession:
    """A boto3 Session with credentials whose clients are the stubbed ones."""

    def __init__(self, clients):
        self.clients = clients

    def get_credentials(self):
        return object()

    def client(self, service, region_name):
        return self.clients[service]


def test_run_rewrites_the_file_on_success_and_leaves_it_on_an_api_error(tmp_path, monkeypatch, stubs, capsys):
    pricing, pricing_stub, ec2, ec2_stub = stubs
    monkeypatch.setattr(boto3, "Session", lambda: FakeSession({"pricing": pricing, "ec2": ec2}))
    book = tmp_path / "prices.yaml"
    dump_price_book(load_price_book(), book)
    before = book.read_bytes()
    args = argparse.Namespace(file=book, region="us-east-1", instance_type=["g6e.xlarge"])
    ec2_stub.add_client_error("describe_spot_price_history", "UnauthorizedOperation", "not allowed", 403)
    assert prices_refresh.run(args) == 1
    assert "not touched" in capsys.readouterr().err and book.read_bytes() == before

    ec2_stub.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        spot_record("g6e.xlarge", "us-east-1a", "0.7", 1)]})
    expect_products(pricing_stub, "g6e.xlarge", [[price_list_item("g6e.xlarge", "1.9")]])
    assert prices_refresh.run(args) == 0
    row = load_price_book(book).instances["g6e.xlarge"]
    assert (row.on_demand.hourly_usd, row.spot.hourly_usd) == (1.9, 0.7)
    assert row.on_demand.as_of == datetime.datetime.now(datetime.UTC).date().isoformat()
    assert book.read_text().startswith("# Price book")
