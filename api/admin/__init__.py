"""api/admin"""
