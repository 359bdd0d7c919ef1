"""epbuild.plan"""
