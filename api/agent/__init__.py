"""api/agent"""
