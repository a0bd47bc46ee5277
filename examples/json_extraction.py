"""Structured extraction: every product description is turned into JSON that follows a schema
(constrained decoding). The instructions come first, so all requests share them as a cached prefix.

    python examples/json_extraction.py --url http://127.0.0.1:30000
"""

import argparse
import json

import radixcluster.lang as sgl

PRODUCT_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "price_usd": {"type": "number"},
        "in_stock": {"type": "boolean"},
    },
    "required": ["name", "price_usd", "in_stock"],
    "additionalProperties": False,
}

INSTRUCTIONS = (
    "You extract product data from shop listings. Answer with one JSON object with the keys "
    "name (the product's name), price_usd (its price in US dollars, a number) and in_stock "
    "(true when the listing says it can be ordered now)."
)

LISTINGS = [
    "The Aurora desk lamp costs $39.90 and ships today.",
    "Trailblazer hiking boots, now $129. Sold out, back in May.",
    "Get the Nimbus kettle for 24.50 dollars; 12 left in stock.",
]


@sgl.function
def extract_product(s, listing):
    s += sgl.system(INSTRUCTIONS)
    s += sgl.user(f"Listing: {listing}")
    s += sgl.assistant(sgl.gen("product", max_tokens=64, temperature=0, json_schema=PRODUCT_SCHEMA))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:30000", help="the radixcluster server")
    args = parser.parse_args()

    states = extract_product.run_batch(
        [{"listing": listing} for listing in LISTINGS], backend=sgl.RuntimeEndpoint(args.url)
    )
    for listing, state in zip(LISTINGS, states):
        print(f"{listing}\n  -> {json.loads(state['product'])}")

    infos = [state.get_cache_hit_info() for state in states]
    total, cached = sum(i["total_tokens"] for i in infos), sum(i["cached_tokens"] for i in infos)
    print(f"\ncache hit rate: {cached}/{total} prompt tokens = {cached / total:.1%}")


if __name__ == "__main__":
    main()
