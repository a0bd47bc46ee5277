"""`python -m radixcluster.launch_server ARGS` is `radixcluster up ARGS`: SGLang's launch line
(`python -m sglang.launch_server --model-path ... --port 30000 ...`) with one word changed."""

import sys

from radixcluster.cli import main

if __name__ == "__main__":  # spawned children import this module again (as __mp_main__)
    raise SystemExit(main(["up", *sys.argv[1:]]))
