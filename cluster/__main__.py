"""`python -m radixcluster` is the `radixcluster` command."""

from radixcluster.cli import main

raise SystemExit(main())
