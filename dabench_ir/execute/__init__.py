"""dabench_ir/execute"""
