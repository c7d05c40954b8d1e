"""dabench_ir/frontends"""
