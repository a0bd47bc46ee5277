"""The multi-round chat of the SGLang RadixTree article (shared/seeds/003, section 4.2), run
with radixcluster.lang in place of sglang: each round extends the previous prompt, so the
server's radix cache serves the earlier rounds.

    python examples/multi_round_chat.py --url http://127.0.0.1:30000
"""

import argparse

import radixcluster.lang as sgl


@sgl.function
def multi_round_chat(s):
    # 第一轮提问
    s += sgl.system("你是一个AI助手，回答要准确简洁。")
    s += sgl.user("介绍一下Transformer架构")
    s += sgl.assistant(sgl.gen("answer1", max_tokens=256))

    # 第二轮追问（自动继承上下文）
    s += sgl.user("它和RNN有什么区别？")
    s += sgl.assistant(sgl.gen("answer2", max_tokens=256))

    # 第三轮再追问
    s += sgl.user("能画个结构图吗？")
    s += sgl.assistant(sgl.gen("answer3", max_tokens=128))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://localhost:30000", help="the radixcluster server")
    args = parser.parse_args()

    # 启动运行（自动连接本地服务）
    state = multi_round_chat.run(backend=sgl.RuntimeEndpoint(args.url))

    print("=== 第一轮回答 ===")
    print(state["answer1"])
    print("\n=== 第二轮回答 ===")
    print(state["answer2"])
    print("\n=== 第三轮回答 ===")
    print(state["answer3"])

    # 查看本次运行的缓存统计
    print(f"\n缓存复用详情：{state.get_cache_hit_info()}")


if __name__ == "__main__":
    main()
