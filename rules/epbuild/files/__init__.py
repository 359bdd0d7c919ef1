"""epbuild.files"""
