"""Tree of thought with fork/join: branches propose approaches in parallel from one cached
prefix, each branch judges its own approach, and the joined results feed the final answer.

    python examples/fork_join.py --url http://127.0.0.1:30000
"""

import argparse

import radixcluster.lang as sgl

QUESTION = "How can a small bakery sell more bread on weekdays?"


@sgl.function
def tree_of_thought(s, question, num_branches):
    s += sgl.system("You are a practical business advisor. Keep every answer to one or two sentences.")
    s += sgl.user(f"{question} Suggest one concrete approach.")
    forks = s.fork(num_branches)
    forks += sgl.assistant(sgl.gen("approach", max_tokens=48, temperature=0.9, stop="\n"))
    # Each branch judges its own approach; the choices begin with a space so they do not
    # merge with the preceding "Verdict:" when tokenized.
    forks += sgl.user("Is this approach cheap to try? Answer with one word.")
    forks += sgl.assistant("Verdict:" + sgl.select("verdict", choices=[" cheap", " expensive"]))
    forks.join()

    candidates = "\n".join(
        f"{i + 1}. {approach} ({verdict.strip()})"
        for i, (approach, verdict) in enumerate(zip(s["approach"], s["verdict"]))
    )
    s += sgl.user(f"Candidate approaches:\n{candidates}\nWhich one should the bakery start with, and why?")
    s += sgl.assistant(sgl.gen("decision", max_tokens=64, temperature=0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:30000", help="the radixcluster server")
    parser.add_argument("--branches", type=int, default=3)
    args = parser.parse_args()

    state = tree_of_thought.run(QUESTION, args.branches, backend=sgl.RuntimeEndpoint(args.url))
    for i, (approach, verdict) in enumerate(zip(state["approach"], state["verdict"])):
        print(f"branch {i + 1}: {approach} [{verdict.strip()}]")
    print(f"\ndecision: {state['decision']}")
    info = state.get_cache_hit_info()
    print(f"\ncache hit rate: {info['cached_tokens']}/{info['total_tokens']} prompt tokens = {info['hit_rate']:.1%}")


if __name__ == "__main__":
    main()
