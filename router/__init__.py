"""The router: request state, tokenizer, RadixTree, page allocator, scheduler, HTTP api."""
