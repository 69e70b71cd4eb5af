"""cpu_speed"""
