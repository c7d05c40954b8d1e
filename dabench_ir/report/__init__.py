"""dabench_ir/report"""
